package cluster_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// BeginFenced begins and fences in one call on every dialect: the token
// is the leader's, the writes commit, and a stale leader gets an error
// and leaves no transaction open.
func TestBeginFenced(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a", slowRenew)
		rows := createRowsTable(t, tg, a.db)
		other := tg.Open(t)

		tx, token, err := a.BeginFenced(ctx, a.db, nil)
		if err != nil || token == 0 || token != a.FencingToken() {
			t.Fatalf("BeginFenced of the leader = %d, %v; want token %d", token, err, a.FencingToken())
		}
		insertRow(t, tg, tx, rows, token, "first")
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, other, rows, "first"); n != 1 {
			t.Fatalf("another pool sees %d rows of the committed fenced transaction, want 1", n)
		}

		if _, _, err := a.BeginFenced(ctx, nil, nil); !errors.Is(err, cluster.ErrInvalidConfig) {
			t.Fatalf("BeginFenced(nil db) = %v, want ErrInvalidConfig", err)
		}
		// A nil *Cluster is an error, not the default instance.
		var none *cluster.Cluster
		if tx, _, err := none.BeginFenced(ctx, other, nil); !errors.Is(err, cluster.ErrInvalidConfig) || tx != nil {
			t.Fatalf("BeginFenced on a nil *Cluster = %v, %v; want no transaction and ErrInvalidConfig", tx, err)
		}

		expireLease(t, tg, a.db)
		b := start(t, tg, "b")
		waitFor(t, 2*time.Second, "b to lead", b.IsLeader)
		tx, token, err = a.BeginFenced(ctx, a.db, nil)
		if !errors.Is(err, cluster.ErrStaleFencingToken) || tx != nil || token != 0 {
			t.Fatalf("BeginFenced of the stale leader = %v, %d, %v; want no transaction and ErrStaleFencingToken", tx, token, err)
		}
		// Nothing is left open: b's fenced write commits at once (on
		// SQLite an open transaction of a would hold the write lock).
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		tx, token, err = b.BeginFenced(wctx, b.db, nil)
		if err != nil {
			t.Fatalf("BeginFenced of the new leader: %v", err)
		}
		insertRow(t, tg, tx, rows, token, "second")
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	})
}

// createRowsTable creates <prefix>fenced_rows for fenced writes.
func createRowsTable(t *testing.T, tg testdb.Target, db *sql.DB) string {
	t.Helper()
	name := tg.Prefix + "fenced_rows"
	ddl := map[cluster.Dialect]string{
		cluster.Postgres: "CREATE TABLE " + name + " (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, fencing_token BIGINT NOT NULL, payload TEXT NOT NULL)",
		cluster.MySQL:    "CREATE TABLE " + name + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, fencing_token BIGINT NOT NULL, payload VARCHAR(64) NOT NULL) ENGINE=InnoDB",
		cluster.SQLite:   "CREATE TABLE " + name + " (id INTEGER PRIMARY KEY, fencing_token INTEGER NOT NULL, payload TEXT NOT NULL)",
	}[tg.Dialect]
	if _, err := db.ExecContext(context.Background(), ddl); err != nil {
		t.Fatal(err)
	}
	return name
}

// execer is what insertRow writes through: *sql.Tx, *sql.Conn, *sql.DB.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func insertRow(t *testing.T, tg testdb.Target, h execer, table string, token uint64, payload string) {
	t.Helper()
	q := bind(tg.Dialect, "INSERT INTO "+table+" (fencing_token, payload) VALUES (?, ?)")
	if _, err := h.ExecContext(context.Background(), q, int64(token), payload); err != nil {
		t.Fatalf("insert %q: %v", payload, err)
	}
}

func countRows(t *testing.T, db *sql.DB, table, payload string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+table+" WHERE payload = '"+payload+"'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// openMySQL opens a pool of cluster.OpenMySQL on tg, closed when the test
// ends.
func openMySQL(t *testing.T, tg testdb.Target) *sql.DB {
	t.Helper()
	cfg, err := mysqldrv.ParseDSN(tg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	db, err := cluster.OpenMySQL(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openWrappedMySQL opens a pool on NewMySQLConnector's connector for tg,
// wrapped as connection-wrapping instrumentation (otelsql) wraps one.
func openWrappedMySQL(t *testing.T, tg testdb.Target) *sql.DB {
	t.Helper()
	cfg, err := mysqldrv.ParseDSN(tg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewMySQLConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(wrappedConnector{c})
	t.Cleanup(func() { db.Close() })
	return db
}

// wrappedConnector's connections hand every call on to the connection
// they wrap, with its context, as instrumenting wrappers do.
type wrappedConnector struct{ driver.Connector }

func (w wrappedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := w.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return wrappedConn{c}, nil
}

type wrappedConn struct{ driver.Conn }

func (c wrappedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c wrappedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c wrappedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c wrappedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c wrappedConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c wrappedConn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

func (c wrappedConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

// On a pool of OpenMySQL a fenced transaction sends no START TRANSACTION
// and takes no more statements than BEGIN, INSERT, COMMIT; its fence
// still holds the lease row until it ends; and statements outside a
// transaction afterwards commit as on any pool.
// The same on a pool of NewMySQLConnector's connector wrapped as
// instrumentation wraps one.
func TestOpenMySQLBeginsFencedTransactionsImplicitly(t *testing.T) {
	t.Parallel()
	t.Run("OpenMySQL", func(t *testing.T) {
		t.Parallel()
		testImplicitBegin(t, openMySQL)
	})
	t.Run("NewMySQLConnector wrapped", func(t *testing.T) {
		t.Parallel()
		testImplicitBegin(t, openWrappedMySQL)
	})
}

func testImplicitBegin(t *testing.T, open func(*testing.T, testdb.Target) *sql.DB) {
	tg := testdb.New(t, cluster.MySQL)
	ctx := context.Background()
	db := open(t, tg)
	db.SetMaxOpenConns(1) // every statement below on one session
	a := startOn(t, tg, tg.Open(t), "a")
	waitFor(t, 2*time.Second, "a to lead", a.IsLeader)
	rows := createRowsTable(t, tg, db)
	other := tg.Open(t)

	status := func(name string) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE '"+name+"'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	fenced := func(payload string, commit bool) {
		t.Helper()
		tx, token, err := a.BeginFenced(ctx, db, nil)
		if err != nil {
			t.Fatalf("BeginFenced: %v", err)
		}
		insertRow(t, tg, tx, rows, token, payload)
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	fenced("warm", true) // bounds the session's idle time, prepares the read

	const n = 10
	begins, questions := status("Com_begin"), status("Questions")
	for i := 0; i < n; i++ {
		fenced("fenced", true)
	}
	begins, questions = status("Com_begin")-begins, status("Questions")-questions
	// Per transaction: the fence's read, the INSERT and COMMIT; once, the
	// SET autocommit = 0 after the SHOW turned it back on, and the two
	// SHOWs that read the counts.
	if begins != 0 || questions > 3*n+4 {
		t.Fatalf("%d fenced transactions sent %d START TRANSACTION and %d statements; want none and at most %d", n, begins, questions, 3*n+4)
	}
	if got := countRows(t, other, rows, "fenced"); got != n {
		t.Fatalf("another pool sees %d committed fenced rows, want %d", got, n)
	}

	// The fence holds the lease row until the transaction ends, on a
	// session whose autocommit is off already and on one turned off for it.
	for _, fresh := range []bool{false, true} {
		if fresh {
			if _, err := db.ExecContext(ctx, "DO 0"); err != nil { // autocommit back on
				t.Fatal(err)
			}
		}
		tx, _, err := a.BeginFenced(ctx, db, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !leaseLocked(t, tg, other) {
			t.Fatalf("the lease row is not locked while a fenced transaction is open (fresh session %v)", fresh)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if leaseLocked(t, tg, other) {
			t.Fatalf("the lease row is still locked after the fenced transaction committed (fresh session %v)", fresh)
		}
	}

	// A rolled-back fenced transaction leaves nothing.
	fenced("rolled back", false)
	if got := countRows(t, other, rows, "rolled back"); got != 0 {
		t.Fatalf("another pool sees %d rows of a rolled-back fenced transaction", got)
	}

	// Statements outside a transaction on the session a fenced transaction
	// left with autocommit off commit at once: text, prepared, and a
	// prepared statement run again, each after a fenced transaction.
	fenced("before text", true)
	if _, err := db.ExecContext(ctx, "INSERT INTO "+rows+" (fencing_token, payload) VALUES (0, 'text')"); err != nil {
		t.Fatal(err)
	}
	fenced("before args", true)
	insertRow(t, tg, db, rows, 0, "args")
	stmt, err := db.PrepareContext(ctx, "INSERT INTO "+rows+" (fencing_token, payload) VALUES (0, ?)")
	if err != nil {
		t.Fatal(err)
	}
	defer stmt.Close()
	fenced("before prepared", true)
	if _, err := stmt.ExecContext(ctx, "prepared"); err != nil {
		t.Fatal(err)
	}
	fenced("before query", true)
	var one int
	if err := db.QueryRowContext(ctx, "SELECT 1 FROM "+rows+" WHERE payload = ? FOR UPDATE", "text").Scan(&one); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"text", "args", "prepared"} {
		if got := countRows(t, other, rows, p); got != 1 {
			t.Fatalf("another pool sees %d rows written outside a transaction after a fenced one (%s), want 1", got, p)
		}
	}
	// The locking read outside a transaction released its lock: another
	// session can update that row.
	uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := other.ExecContext(uctx, "UPDATE "+rows+" SET fencing_token = 1 WHERE payload = 'text'"); err != nil {
		t.Fatalf("a row read FOR UPDATE outside a transaction is still locked: %v", err)
	}

	// A plain transaction on a session with autocommit off.
	fenced("before plain", true)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	insertRow(t, tg, tx, rows, 0, "plain rolled back")
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	insertRow(t, tg, tx, rows, 0, "plain")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// A plain transaction after a fenced one runs with autocommit on, as
	// on any pool (a statement after an implicit commit in it would
	// otherwise be held until its end).
	fenced("before plain autocommit", true)
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var autocommit int
	if err := tx.QueryRowContext(ctx, "SELECT @@autocommit").Scan(&autocommit); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	if autocommit != 1 {
		t.Fatalf("a plain transaction after a fenced one runs with autocommit %d, want 1", autocommit)
	}
	if got, gone := countRows(t, other, rows, "plain"), countRows(t, other, rows, "plain rolled back"); got != 1 || gone != 0 {
		t.Fatalf("plain transactions after a fenced one: %d committed rows (want 1), %d rolled-back rows (want 0)", got, gone)
	}

	// A fenced transaction with an isolation level, and a read-only one:
	// at READ COMMITTED a second read sees what another session committed
	// after the first (at the default REPEATABLE READ it would not).
	for _, level := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelDefault} {
		tx, _, err = a.BeginFenced(ctx, db, &sql.TxOptions{Isolation: level})
		if err != nil {
			t.Fatalf("BeginFenced at %v: %v", level, err)
		}
		read := func() (v int64) {
			t.Helper()
			if err := tx.QueryRowContext(ctx, "SELECT fencing_token FROM "+rows+" WHERE payload = 'plain'").Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		}
		before := read()
		if _, err := other.ExecContext(ctx, "UPDATE "+rows+" SET fencing_token = fencing_token + 1 WHERE payload = 'plain'"); err != nil {
			t.Fatal(err)
		}
		sees := read() != before
		tx.Rollback()
		if sees != (level == sql.LevelReadCommitted) {
			t.Errorf("BeginFenced at %v: a second read sees another session's commit: %v", level, sees)
		}
	}
	if _, _, err := a.BeginFenced(ctx, db, &sql.TxOptions{Isolation: sql.LevelLinearizable}); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Errorf("BeginFenced at LevelLinearizable = %v; want ErrInvalidConfig: MySQL has no such level", err)
	}
	tx, _, err = a.BeginFenced(ctx, db, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only BeginFenced: %v", err)
	}
	tx.Rollback()
	fenced("after options", true)
	if got := countRows(t, other, rows, "after options"); got != 1 {
		t.Fatalf("another pool sees %d rows of the fenced transaction after the options, want 1", got)
	}
}

// leaseLocked reports whether the lease row "leader" stays locked against
// db's NOWAIT lock over several tries (a renew locks it for a moment).
func leaseLocked(t *testing.T, tg testdb.Target, db *sql.DB) bool {
	t.Helper()
	ctx := context.Background()
	for try := 0; try < 5; try++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var name string
		err = tx.QueryRowContext(ctx, "SELECT name FROM "+tg.Prefix+"lease WHERE name = ? FOR UPDATE NOWAIT", "leader").Scan(&name)
		tx.Rollback()
		if err == nil {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// A stale leader's BeginFenced on an OpenMySQL pool leaves no transaction
// open on the session: the next statement outside a transaction commits.
// The pool also serves as Config.DB.
func TestOpenMySQLStaleBeginFencedLeavesNothingOpen(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.MySQL)
	ctx := context.Background()
	db := openMySQL(t, tg)
	a := startOn(t, tg, db, "a", slowRenew)
	waitFor(t, 2*time.Second, "a to lead", a.IsLeader)
	rows := createRowsTable(t, tg, db)
	other := tg.Open(t)
	db.SetMaxOpenConns(1)

	tx, token, err := a.BeginFenced(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	insertRow(t, tg, tx, rows, token, "led")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	expireLease(t, tg, other)
	b := start(t, tg, "b")
	waitFor(t, 2*time.Second, "b to lead", b.IsLeader)
	if _, _, err := a.BeginFenced(ctx, db, nil); !errors.Is(err, cluster.ErrStaleFencingToken) {
		t.Fatalf("BeginFenced of the stale leader = %v, want ErrStaleFencingToken", err)
	}
	insertRow(t, tg, db, rows, 0, "after")
	if got := countRows(t, other, rows, "after"); got != 1 {
		t.Fatalf("another pool sees %d rows written after a refused BeginFenced, want 1: a transaction was left open", got)
	}
}

// OpenMySQL refuses what it cannot open: no config, or a DSN that sets
// the autocommit it manages.
func TestOpenMySQLRefusesBadConfig(t *testing.T) {
	if _, err := cluster.OpenMySQL(nil); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("OpenMySQL(nil) = %v, want ErrInvalidConfig", err)
	}
	if _, err := cluster.NewMySQLConnector(nil); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("NewMySQLConnector(nil) = %v, want ErrInvalidConfig", err)
	}
	for _, param := range []string{"autocommit", "AUTOCOMMIT", "@@autocommit", "@@session.autocommit", "@@SESSION.AutoCommit", "@@local.autocommit"} {
		cfg, err := mysqldrv.ParseDSN("app@tcp(db.internal:3306)/app?" + param + "=0")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cluster.OpenMySQL(cfg); !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), param+"=0") {
			t.Errorf("OpenMySQL(%s=0) = %v, want ErrInvalidConfig naming the setting", param, err)
		}
		if _, err := cluster.NewMySQLConnector(cfg); !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), param+"=0") {
			t.Errorf("NewMySQLConnector(%s=0) = %v, want ErrInvalidConfig naming the setting", param, err)
		}
	}
	// A DSN without it: every session starts with autocommit on, whatever
	// the server's default, and the caller's config is left as it was.
	cfg, err := mysqldrv.ParseDSN("app@tcp(db.internal:3306)/app?sql_mode=%27ANSI%27")
	if err != nil {
		t.Fatal(err)
	}
	db, err := cluster.OpenMySQL(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, ok := cfg.Params["autocommit"]; ok || len(cfg.Params) != 1 {
		t.Errorf("OpenMySQL changed the caller's Params: %v", cfg.Params)
	}
}

// A fenced transaction whose statement was cancelled by its own context
// (the driver closes the connection) reports the cause at Commit, as a
// transaction of go-sql-driver/mysql does, and the pool goes on.
func TestOpenMySQLCommitAfterCancelledStatement(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.MySQL)
	ctx := context.Background()
	a := startOn(t, tg, tg.Open(t), "a")
	waitFor(t, 2*time.Second, "a to lead", a.IsLeader)
	db := openMySQL(t, tg)
	tx, _, err := a.BeginFenced(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = tx.ExecContext(sctx, "DO SLEEP(2)")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a statement past its deadline = %v", err)
	}
	if err := tx.Commit(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Commit after a cancelled statement = %v, want the cause (context.DeadlineExceeded)", err)
	}
	// The server rolls the transaction back once the statement it was
	// running ends and it finds the client gone.
	other := tg.Open(t)
	waitFor(t, 5*time.Second, "the lease row to be unlocked", func() bool { return !leaseLocked(t, tg, other) })
	// The statement held the lease row longer than the lease lasts, so a
	// could not renew and stood down; it leads again once the row is free.
	waitFor(t, 5*time.Second, "a to lead again", a.IsLeader)
	tx, _, err = a.BeginFenced(ctx, db, nil)
	if err != nil {
		t.Fatalf("BeginFenced after a connection was closed: %v", err)
	}
	tx.Rollback()
}
