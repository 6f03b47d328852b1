package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

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
