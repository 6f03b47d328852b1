package clusterpgx_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// openSQL opens a database/sql pool of pgx's stdlib driver on tg with
// open (stdlib.OpenDB, clusterpgx.OpenDB), every statement logged to log
// when it is not nil.
func openSQL(t *testing.T, tg testdb.Target, open func(pgx.ConnConfig, ...stdlib.OptionOpenDB) *sql.DB, log *sentLog) *sql.DB {
	t.Helper()
	cc, err := pgx.ParseConfig(tg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if log != nil {
		cc.Tracer = log
	}
	db := open(*cc)
	t.Cleanup(func() { db.Close() })
	return db
}

// openFromPool is clusterpgx.OpenDBFromPool over a pgxpool on tg of at
// most maxConns connections (0: pgxpool's default), with the
// ConnConfig's tracer.
func openFromPool(t *testing.T, tg testdb.Target, maxConns int32) func(pgx.ConnConfig, ...stdlib.OptionOpenDB) *sql.DB {
	return func(cc pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
		cfg, err := pgxpool.ParseConfig(tg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.Tracer = cc.Tracer
		if maxConns > 0 {
			cfg.MaxConns = maxConns
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return clusterpgx.OpenDBFromPool(pool, opts...)
	}
}

// backendPID is the server process of q's connection.
func backendPID(t *testing.T, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var pid int
	if err := q.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("reading the backend pid (a connection not given back?): %v", err)
	}
	return pid
}

// inTransaction reports whether q (a transaction, or a pool of one
// connection) runs its statements inside a transaction block: only there
// can a savepoint be set (elsewhere PostgreSQL refuses, 25P01).
func inTransaction(t *testing.T, q interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}) bool {
	t.Helper()
	// A transaction left open also holds the pool's one connection: the
	// probe would wait for it forever.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := q.ExecContext(ctx, "SAVEPOINT sqlfence_probe")
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		t.Fatal("the pool's only connection was not given back: a transaction was left open")
	case err == nil:
		if _, err := q.ExecContext(ctx, "RELEASE SAVEPOINT sqlfence_probe"); err != nil {
			t.Fatal(err)
		}
		return true
	case errors.As(err, &pgErr) && pgErr.Code == "25P01":
		return false
	}
	t.Fatalf("probing for an open transaction: %v", err)
	return false
}

// sqlBegin is one way to begin a fenced database/sql transaction.
type sqlBegin struct {
	name string
	f    func(context.Context, *sql.DB, *sql.TxOptions) (*sql.Tx, uint64, error)
}

// sqlBegins is Cluster.BeginFenced of c (the default instance when c is
// nil).
func sqlBegins(c *cluster.Cluster) []sqlBegin {
	if c == nil {
		c = cluster.Default()
	}
	return []sqlBegin{{"Cluster.BeginFenced", c.BeginFenced}}
}

// BeginFencedSQL on a pool of clusterpgx.OpenDB begins and fences a
// database/sql transaction in one batch (nothing sent before it), holds
// the lease row until the transaction ends, honours the options, and
// refuses a stale leader or a follower without leaving a transaction open
// on the connection; on a pool of stdlib.OpenDB it does the same in two
// round trips.
func TestBeginFencedSQL(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	admin := newPool(t, tg, 0)
	orders := tg.Prefix + "orders"
	if _, err := admin.Exec(ctx, "CREATE TABLE "+orders+" (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	slow := func(c *cluster.Config) {
		// a renews rarely, so it still believes it leads after the takeover.
		c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 5*time.Second, 2*time.Second, 4*time.Second
	}
	a := node(t, tg, newPool(t, tg, 0), "a", slow)
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	lockable := func() error {
		_, err := admin.Exec(ctx, "SELECT 1 FROM "+tg.Prefix+"lease FOR UPDATE NOWAIT")
		return err
	}

	if _, _, err := a.BeginFenced(ctx, nil, nil); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("BeginFencedSQL on a nil *sql.DB = %v, want ErrInvalidConfig", err)
	}

	for _, pool := range []struct {
		name      string
		open      func(pgx.ConnConfig, ...stdlib.OptionOpenDB) *sql.DB
		oneBatch  bool
		wantSends string
	}{
		{"clusterpgx.OpenDB", clusterpgx.OpenDB, true, "one batch of the BEGIN and the fence, nothing else"},
		{"clusterpgx.OpenDBFromPool", openFromPool(t, tg, 1), true, "one batch of the BEGIN and the fence, nothing else"},
		{"stdlib.OpenDB", stdlib.OpenDB, false, "the BEGIN, then the fence, no batch"},
	} {
		t.Run(pool.name, func(t *testing.T) {
			log := &sentLog{}
			app := openSQL(t, tg, pool.open, log)
			app.SetMaxOpenConns(1) // so that the probes run on the connection BeginFencedSQL used
			pid := backendPID(t, app)
			// A refused call gives the same connection back, out of any
			// transaction (stdlib would discard one left in a transaction
			// when it is next used, and its lease row lock with it; a
			// connection kept idle in the pool would hold the lock meanwhile).
			givenBack := func(what string) {
				t.Helper()
				if n := app.Stats().InUse; n != 0 {
					t.Errorf("%s: %d connections in use; want 0", what, n)
				}
				if err := lockable(); err != nil {
					t.Errorf("%s: the lease row is locked: %v", what, err)
				}
				if got := backendPID(t, app); got != pid {
					t.Errorf("%s: the pool's connection was replaced (server process %d, was %d): it was left in a transaction", what, got, pid)
				}
				if inTransaction(t, app) {
					t.Errorf("%s left its transaction open", what)
				}
			}
			// cluster's BeginFenced takes the same path: this package's
			// connection honours its request.
			for _, begin := range sqlBegins(a) {
				log.reset()
				tx, token, err := begin.f(ctx, app, nil)
				if err != nil {
					t.Fatalf("%s by the leader: %v", begin.name, err)
				}
				if token != a.FencingToken() || token == 0 {
					t.Errorf("%s returned token %d; the leader's is %d", begin.name, token, a.FencingToken())
				}
				batches, singles := log.reset()
				var sentRight bool
				if pool.oneBatch {
					sentRight = len(batches) == 1 && len(batches[0]) == 2 && strings.HasPrefix(strings.ToLower(batches[0][0]), "begin") &&
						strings.Contains(batches[0][1], tg.Prefix+"lease") && len(singles) == 0
				} else {
					sentRight = len(batches) == 0 && len(singles) == 2 && strings.HasPrefix(strings.ToLower(singles[0]), "begin") &&
						strings.Contains(singles[1], tg.Prefix+"lease")
				}
				if !sentRight {
					tx.Rollback() // or the pgxpool's Close, at cleanup, waits for it
					t.Fatalf("%s sent batches %q and statements %q; want %s", begin.name, batches, singles, pool.wantSends)
				}
				if err := lockable(); !isLockNotAvailable(err) {
					t.Errorf("locking the lease row during a fenced transaction = %v, want lock_not_available (55P03)", err)
				}
				if !inTransaction(t, tx) {
					t.Errorf("the transaction %s returned is not a transaction block", begin.name)
				}
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+orders+" (token) VALUES ($1)", int64(token)); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatalf("commit: %v", err)
				}
				if err := lockable(); err != nil {
					t.Errorf("the lease row is still locked after the commit: %v", err)
				}
				givenBack("a committed " + begin.name)
			}

			// Options reach the BEGIN.
			for level, want := range map[sql.IsolationLevel]string{
				sql.LevelDefault:        "read committed",
				sql.LevelReadCommitted:  "read committed",
				sql.LevelRepeatableRead: "repeatable read",
				sql.LevelSerializable:   "serializable",
			} {
				tx, _, err := a.BeginFenced(ctx, app, &sql.TxOptions{Isolation: level})
				if err != nil {
					t.Fatal(err)
				}
				var iso string
				if err := tx.QueryRowContext(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil || iso != want {
					t.Errorf("isolation in a BeginFencedSQL at %v = %q (%v), want %q", level, iso, err, want)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
			}
			givenBack("a rolled back BeginFencedSQL")
			// A read-only transaction cannot hold the lease row: refused,
			// and nothing left open.
			tx, _, err := a.BeginFenced(ctx, app, &sql.TxOptions{ReadOnly: true})
			if !errors.Is(err, cluster.ErrReadOnly) || tx != nil {
				t.Errorf("a read-only BeginFencedSQL = %v, %v; want nil and ErrReadOnly", tx, err)
			}
			givenBack("a read-only BeginFencedSQL")
			// An isolation level PostgreSQL lacks: an error, nothing open.
			if _, _, err := a.BeginFenced(ctx, app, &sql.TxOptions{Isolation: sql.LevelLinearizable}); err == nil || pool.oneBatch && !errors.Is(err, cluster.ErrInvalidConfig) {
				t.Errorf("BeginFencedSQL with LevelLinearizable = %v; want an error (wrapping ErrInvalidConfig on clusterpgx's pools)", err)
			}
			givenBack("a BeginFencedSQL with a bad isolation level")
			// A deadline that passes while the fence waits for the lease
			// row (another transaction holds it for update): an error,
			// nothing left locked or in use, and the pool still works.
			hold, err := admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := hold.Exec(ctx, "SELECT 1 FROM "+tg.Prefix+"lease FOR UPDATE"); err != nil {
				t.Fatal(err)
			}
			dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			if tx, _, err := a.BeginFenced(dctx, app, nil); err == nil {
				tx.Rollback()
				t.Error("BeginFencedSQL succeeded while the lease row was locked for update")
			}
			cancel()
			hold.Rollback(ctx)
			// database/sql rolls back a transaction whose context ended on
			// a goroutine of its own: give it a moment.
			if !waitUntil(time.Second, func() bool { return app.Stats().InUse == 0 }) {
				t.Errorf("%d connections in use after a BeginFencedSQL past its deadline; want 0", app.Stats().InUse)
			}
			// The driver closed the connection whose statement it gave up
			// on; the server process, granted the row once the holder let
			// go, ends when it finds its client gone, a moment later.
			// Until then it may still be waiting for the row, and take it
			// after a first check found it free: wait for no server
			// process in a transaction on the lease table but members'
			// statements in flight, and then for the row to be free.
			settled := func() bool {
				var busy int
				err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE pid <> pg_backend_pid() AND xact_start IS NOT NULL
					AND (wait_event_type = 'Lock' OR state <> 'active') AND position($1 in query) > 0`,
					tg.Prefix+"lease").Scan(&busy)
				return err == nil && busy == 0 && lockable() == nil
			}
			if !waitUntil(3*time.Second, settled) {
				t.Errorf("the lease row is still locked 3s after a BeginFencedSQL past its deadline: %v", lockable())
			}
			if inTransaction(t, app) {
				t.Error("a BeginFencedSQL past its deadline left its transaction open")
			}
			pid = backendPID(t, app) // the driver may have closed the connection it cancelled on
			// A plain BeginTx on the same pool is stdlib's.
			log.reset()
			plain, err := app.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := lockable(); err != nil {
				t.Errorf("a plain transaction locks the lease row: %v", err)
			}
			plain.Rollback()
			if batches, singles := log.reset(); len(batches) != 0 || len(singles) != 2 {
				t.Errorf("a plain BeginTx and its rollback sent batches %q and statements %q; want the BEGIN and the ROLLBACK", batches, singles)
			}
		})
	}

	// A takeover behind a's back: its next BeginFencedSQL is refused, on
	// either pool, leaving the connection out of any transaction.
	if _, err := admin.Exec(ctx, "UPDATE "+tg.Prefix+"lease SET expires_at = 0"); err != nil {
		t.Fatal(err)
	}
	b := node(t, tg, newPool(t, tg, 0), "b", slow)
	if !b.IsLeader() || !a.IsLeader() {
		t.Fatalf("want b leading and a still believing it does: a %v, b %v", a.IsLeader(), b.IsLeader())
	}
	f := node(t, tg, newPool(t, tg, 0), "f", slow)
	for i, open := range []func(pgx.ConnConfig, ...stdlib.OptionOpenDB) *sql.DB{clusterpgx.OpenDB, openFromPool(t, tg, 1), stdlib.OpenDB} {
		app := openSQL(t, tg, open, nil)
		app.SetMaxOpenConns(1)
		// a may have learnt of the takeover by the second pool (its
		// renewal is due every 2s): then it is refused as a follower.
		want := cluster.ErrStaleFencingToken
		if i > 0 {
			want = cluster.ErrNotLeader
		}
		pid := backendPID(t, app)
		tx, token, err := a.BeginFenced(ctx, app, nil)
		if !errors.Is(err, want) || tx != nil || token != 0 {
			t.Fatalf("BeginFencedSQL by the stale leader = %v, %d, %v; want nil, 0, %v", tx, token, err, want)
		}
		if err := lockable(); err != nil {
			t.Errorf("the lease row is locked after a stale BeginFencedSQL: %v", err)
		}
		if got := backendPID(t, app); got != pid || inTransaction(t, app) {
			t.Errorf("a stale BeginFencedSQL left its transaction open (server process %d, was %d)", got, pid)
		}
		// A follower is refused too.
		if _, _, err := f.BeginFenced(ctx, app, nil); !errors.Is(err, cluster.ErrNotLeader) {
			t.Fatalf("BeginFencedSQL by a follower = %v, want ErrNotLeader", err)
		}
		if got := backendPID(t, app); got != pid || inTransaction(t, app) {
			t.Errorf("a follower's BeginFencedSQL left its transaction open (server process %d, was %d)", got, pid)
		}
		tx, token, err = b.BeginFenced(ctx, app, nil)
		if err != nil || token != b.FencingToken() {
			t.Fatalf("BeginFencedSQL by the new leader = %d, %v; want its token %d", token, err, b.FencingToken())
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+orders+" (token) VALUES ($1)", int64(token)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+orders).Scan(&n); err != nil || n != 6 {
		t.Fatalf("%d orders committed (%v); want three from a (one on each of three pools) and three from b", n, err)
	}
}

// BeginFencedSQL works on any *sql.DB: on SQLite it begins the
// transaction and fences it in a statement of its own.
func TestBeginFencedSQLOnSQLite(t *testing.T) {
	tg := testdb.New(t, cluster.SQLite)
	ctx := context.Background()
	db := tg.Open(t)
	c, err := cluster.New(ctx, tg.Config(t, db, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(ctx)
	if !c.IsLeader() {
		t.Fatal("a does not lead")
	}
	tx, token, err := c.BeginFenced(ctx, db, nil)
	if err != nil || token != c.FencingToken() {
		t.Fatalf("BeginFencedSQL on SQLite = %d, %v; want %d", token, err, c.FencingToken())
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// Without cluster.Init BeginFencedSQL with a nil Cluster, and
// cluster.BeginFenced, begin a plain transaction and return token 0, on
// either kind of pool; on clusterpgx.OpenDB's the connection answers the
// request (one batch, the BEGIN alone). A nil *Cluster's BeginFenced is
// an error, not the default instance.
func TestBeginFencedSQLWithoutInit(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	for _, pool := range []struct {
		open     func(pgx.ConnConfig, ...stdlib.OptionOpenDB) *sql.DB
		oneBatch bool
	}{{clusterpgx.OpenDB, true}, {stdlib.OpenDB, false}} {
		log := &sentLog{}
		app := openSQL(t, tg, pool.open, log)
		app.SetMaxOpenConns(1)
		backendPID(t, app) // connected: the log holds only what follows
		for _, begin := range sqlBegins(nil) {
			log.reset()
			tx, token, err := begin.f(ctx, app, nil)
			if err != nil || token != 0 {
				t.Fatalf("%s without Init = %d, %v; want 0, nil", begin.name, token, err)
			}
			batches, singles := log.reset()
			if pool.oneBatch && (len(batches) != 1 || len(singles) != 0) || !pool.oneBatch && (len(batches) != 0 || len(singles) != 1) {
				t.Errorf("%s without Init sent batches %q and statements %q; want one BEGIN, in a batch on clusterpgx.OpenDB's pool", begin.name, batches, singles)
			}
			if !inTransaction(t, tx) {
				t.Errorf("%s without Init returned no transaction block", begin.name)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		var none *cluster.Cluster
		if tx, _, err := none.BeginFenced(ctx, app, nil); !errors.Is(err, cluster.ErrInvalidConfig) || tx != nil {
			t.Errorf("BeginFenced on a nil *Cluster = %v, %v; want no transaction and ErrInvalidConfig", tx, err)
		}
		if inTransaction(t, app) {
			t.Error("a refused BeginFenced left a transaction open")
		}
	}
}

// With cluster.Init, cluster.BeginFenced on clusterpgx.OpenDB's pool
// fences with the default instance in one batch; after Shutdown it is
// refused and leaves nothing open. Init holds once per process, so the
// test runs itself in a child process.
func TestDefaultInstanceBeginFenced(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	const child = "CLUSTERPGX_TEST_DEFAULT_INSTANCE"
	if os.Getenv(child) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDefaultInstanceBeginFenced$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), child+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestDefaultInstanceBeginFenced") {
			t.Fatalf("the child process: %v\n%s", err, out)
		}
		return
	}
	ctx := context.Background()
	log := &sentLog{}
	app := openSQL(t, tg, clusterpgx.OpenDB, log)
	app.SetMaxOpenConns(1)
	p, err := clusterpgx.NewStdlibProvider(openSQL(t, tg, clusterpgx.OpenDB, nil), tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Init(ctx, cluster.Config{NodeID: "a", Provider: p, Logger: testdb.Logger(t)}); err != nil {
		t.Fatal(err)
	}
	shut := false
	defer func() {
		if !shut {
			cluster.Shutdown(ctx)
		}
	}()
	if !waitUntil(2*time.Second, cluster.IsLeader) {
		t.Fatal("the default instance does not lead")
	}
	pid := backendPID(t, app)
	log.reset()
	tx, token, err := cluster.Default().BeginFenced(ctx, app, nil)
	if err != nil || token == 0 || token != cluster.FencingToken() {
		t.Fatalf("cluster.BeginFenced = %d, %v; want the leader's token %d", token, err, cluster.FencingToken())
	}
	if batches, singles := log.reset(); len(batches) != 1 || len(batches[0]) != 2 || len(singles) != 0 {
		tx.Rollback()
		t.Fatalf("cluster.BeginFenced sent batches %q and statements %q; want one batch of the BEGIN and the fence", batches, singles)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	shut = true
	if err := cluster.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	tx, _, err = cluster.Default().BeginFenced(ctx, app, nil)
	if !errors.Is(err, cluster.ErrShutdown) || tx != nil {
		t.Fatalf("cluster.BeginFenced after Shutdown = %v, %v; want no transaction and ErrShutdown", tx, err)
	}
	if got := backendPID(t, app); got != pid || inTransaction(t, app) {
		t.Errorf("a refused cluster.BeginFenced left its transaction open (server process %d, was %d)", got, pid)
	}
}

// nestingProvider's Fence begins a transaction of its own on db, as a
// provider that records each fence elsewhere might, before it fences.
type nestingProvider struct {
	*cluster.DBProvider
	db     *sql.DB
	nested func(*sql.Tx)
}

func (p nestingProvider) Fence(ctx context.Context, tx provider.Querier, l provider.Lease, ttl time.Duration) error {
	ntx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	p.nested(ntx)
	if err := ntx.Rollback(); err != nil {
		return err
	}
	return p.DBProvider.Fence(ctx, tx, l, ttl)
}

// A transaction that the provider's Fence begins on the same
// clusterpgx.OpenDB pool, in the context it is given, while BeginFenced
// fences is a plain one: the request of the BeginFenced in progress is
// not passed on to it (else each fence would begin another, fenced).
func TestBeginFencedHidesItsRequestFromNestedBegins(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	log := &sentLog{}
	app := openSQL(t, tg, clusterpgx.OpenDB, log)
	app.SetMaxOpenConns(3)
	p, err := clusterpgx.NewStdlibProvider(openSQL(t, tg, clusterpgx.OpenDB, nil), tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	nested := 0
	np := nestingProvider{DBProvider: p, db: app, nested: func(tx *sql.Tx) {
		nested++
		if !inTransaction(t, tx) {
			t.Error("the nested BeginTx returned no transaction block")
		}
	}}
	c, err := cluster.New(ctx, cluster.Config{NodeID: "a", Provider: np, Logger: testdb.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	if !c.IsLeader() {
		t.Fatal("a does not lead")
	}
	log.reset()
	tx, token, err := c.BeginFenced(ctx, app, nil)
	if err != nil || token != c.FencingToken() {
		t.Fatalf("BeginFenced = %d, %v; want token %d", token, err, c.FencingToken())
	}
	defer tx.Rollback()
	batches, singles := log.reset()
	// The outer batch (BEGIN and fence), and the nested plain BEGIN, the
	// probe's two statements and the ROLLBACK, each on its own.
	if nested != 1 || len(batches) != 1 || len(singles) != 4 || singles[0] != "begin" || singles[3] != "rollback" {
		t.Fatalf("BeginFenced with a nesting Fence began %d nested transactions and sent batches %q and statements %q; want one nested plain BEGIN and ROLLBACK", nested, batches, singles)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// NewStdlibProvider takes a database/sql pool of pgx's stdlib driver,
// however it was opened, and its followers hear releases: one takes over
// on the notification, long before its next poll. A pool of another
// driver is refused.
func TestStdlibProviderHearsReleases(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	admin := newPool(t, tg, 0)
	for _, pool := range []struct {
		name string
		open func(pgx.ConnConfig, ...stdlib.OptionOpenDB) *sql.DB
	}{
		{"stdlib.OpenDB", stdlib.OpenDB},
		{"clusterpgx.OpenDB", clusterpgx.OpenDB},
		{"clusterpgx.OpenDBFromPool", openFromPool(t, tg, 0)},
	} {
		t.Run(pool.name, func(t *testing.T) {
			member := func(id string) *cluster.Cluster {
				p, err := clusterpgx.NewStdlibProvider(openSQL(t, tg, pool.open, nil), tg.Prefix)
				if err != nil {
					t.Fatal(err)
				}
				cfg := cluster.Config{NodeID: id, Provider: p, Logger: testdb.Logger(t)}
				longPoll(&cfg)
				c, err := cluster.New(ctx, cfg)
				if err != nil {
					t.Fatalf("New(%s): %v", id, err)
				}
				t.Cleanup(func() { c.Shutdown(context.Background()) })
				return c
			}
			a, b := member("a-"+pool.name), member("b-"+pool.name)
			if !a.IsLeader() && !b.IsLeader() {
				t.Fatal("neither member leads")
			}
			follower := b
			if b.IsLeader() {
				follower = a
			}
			waitFor(t, 3*time.Second, "the follower to hear releases", func() bool { return follower.Stats().HearingReleases })
			time.Sleep(100 * time.Millisecond) // let its first attempt, made at start, land
			expireQuietly(t, admin, tg)
			if _, err := admin.Exec(ctx, "SELECT pg_notify($1, 'leader')", tg.Prefix+"lease"); err != nil {
				t.Fatal(err)
			}
			took := waitFor(t, 2*time.Second, "the follower to take over on the notification", follower.IsLeader)
			t.Logf("the follower led %v after the notification (its poll: up to 6s)", took.Round(time.Millisecond))
			a.Shutdown(ctx)
			b.Shutdown(ctx)
		})
	}
	sqlite := testdb.New(t, cluster.SQLite)
	if _, err := clusterpgx.NewStdlibProvider(sqlite.Open(t), ""); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Errorf("NewStdlibProvider on a SQLite pool = %v, want ErrInvalidConfig", err)
	}
	if _, err := clusterpgx.NewStdlibProvider(nil, ""); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Errorf("NewStdlibProvider(nil) = %v, want ErrInvalidConfig", err)
	}
}

// pingCounter counts the liveness pings pgx sends on a connection (the
// simple query "-- ping").
type pingCounter struct {
	net.Conn
	n *atomic.Int32
}

func (c pingCounter) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("-- ping")) {
		c.n.Add(1)
	}
	return c.Conn.Write(b)
}

// On a pool of OpenDB, and on a pgxpool with ShouldPing, the provider's
// statements skip pgx's liveness ping, which a listening follower's one
// statement per LeaseTTL would otherwise pay each time; the
// application's statements keep it.
func TestProviderStatementsSkipPing(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	counting := func(pings *atomic.Int32) pgconn.DialFunc {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := new(net.Dialer).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return pingCounter{c, pings}, nil
		}
	}
	for _, pool := range []struct {
		name string
		// open returns a provider over a pool of one connection that
		// counts its pings, and the application's statement on the pool.
		open func(pings *atomic.Int32) (*cluster.DBProvider, func() error)
	}{
		{"OpenDB", func(pings *atomic.Int32) (*cluster.DBProvider, func() error) {
			cc, err := pgx.ParseConfig(tg.DSN)
			if err != nil {
				t.Fatal(err)
			}
			cc.DialFunc = counting(pings)
			db := clusterpgx.OpenDB(*cc)
			t.Cleanup(func() { db.Close() })
			db.SetMaxOpenConns(1)
			p, err := clusterpgx.NewStdlibProvider(db, tg.Prefix)
			if err != nil {
				t.Fatal(err)
			}
			return p, func() error { _, err := db.ExecContext(ctx, "SELECT 1"); return err }
		}},
		{"pgxpool", func(pings *atomic.Int32) (*cluster.DBProvider, func() error) {
			cfg, err := pgxpool.ParseConfig(tg.DSN)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.DialFunc = counting(pings)
			cfg.MaxConns = 1
			cfg.ShouldPing = clusterpgx.ShouldPing
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return pgxProvider(t, tg, pool), func() error { _, err := pool.Exec(ctx, "SELECT 1"); return err }
		}},
	} {
		t.Run(pool.name, func(t *testing.T) {
			var pings atomic.Int32
			p, appStatement := pool.open(&pings)
			if err := p.Init(ctx); err != nil {
				t.Fatal(err)
			}
			req := provider.LeaseRequest{Name: "leader-" + pool.name, Holder: "a", Instance: "a1", TTL: 10 * time.Second}
			l, err := p.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			const idle = 1100 * time.Millisecond // pgx pings a connection idle for over a second
			time.Sleep(idle)
			if _, err := p.Renew(ctx, l, req.TTL); err != nil {
				t.Fatal(err)
			}
			if n := pings.Load(); n != 0 {
				t.Fatalf("%d pings before the provider's renew on a connection idle for %v, want none", n, idle)
			}
			time.Sleep(idle)
			if err := appStatement(); err != nil {
				t.Fatal(err)
			}
			if n := pings.Load(); n != 1 {
				t.Fatalf("%d pings before the application's statement on a connection idle for %v, want pgx's one", n, idle)
			}
		})
	}
}
