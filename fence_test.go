package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// A leader whose lease was taken while it still believes it leads is
// refused by the database, not just by IsLeader.
func TestFenceRefusesStaleLeader(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		// a renews rarely, so it keeps believing for a while after the
		// database moved on.
		a := start(t, tg, "a", slowRenew)
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Fence(ctx, tx); err != nil {
			t.Fatalf("Fence of the leader: %v", err)
		}
		tx.Rollback()

		expireLease(t, tg, a.db)
		b := start(t, tg, "b")
		// b's first attempt may time out on a loaded machine (a new
		// connection can take longer than its heartbeat); a renews only
		// every 2s, so it still believes meanwhile.
		waitFor(t, time.Second, "b to lead", b.IsLeader)
		if !b.IsLeader() || !a.IsLeader() {
			t.Fatalf("setup: want both to believe they lead; a %v, b %v", a.IsLeader(), b.IsLeader())
		}
		tx, err = a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		_, err = a.Fence(ctx, tx)
		if !errors.Is(err, cluster.ErrStaleFencingToken) || !errors.Is(err, cluster.ErrNotLeader) || cluster.HTTPStatus(err) != http.StatusServiceUnavailable {
			t.Fatalf("Fence of the stale leader = %v, want ErrStaleFencingToken (and ErrNotLeader, 503)", err)
		}
		t.Logf("refused: %v", err)
		tx.Rollback() // SQLite has one writer at a time

		tx2, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx2.Rollback()
		if _, err := b.Fence(ctx, tx2); err != nil {
			t.Fatalf("Fence of the new leader: %v", err)
		}
	})
}

func TestFenceFollowerAndShutdown(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		f := start(t, tg, "f", func(c *cluster.Config) { c.Role = cluster.RoleFollower })
		if _, err := f.Fence(ctx, f.db); !errors.Is(err, cluster.ErrStaleFencingToken) {
			t.Fatalf("Fence of a follower = %v", err)
		}
		if _, err := a.Fence(ctx, a.db); err != nil {
			t.Fatalf("Fence outside a transaction: %v", err)
		}
		a.Shutdown(ctx)
		if _, err := a.Fence(ctx, f.db); !errors.Is(err, cluster.ErrStaleFencingToken) {
			t.Fatalf("Fence after Shutdown = %v", err)
		}
	})
}

// A nil transaction, or a nil pointer of a type that would be one, is an
// error that names the call, not a panic, for every call that works in the
// caller's transaction.
func TestNilTransactionIsAnError(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		if _, err := tg.Open(t).ExecContext(ctx, "CREATE TABLE "+tg.Prefix+"audit (monotonic_counter BIGINT PRIMARY KEY, row_hash VARCHAR(64) NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		a := start(t, tg, "a", func(c *cluster.Config) {
			c.Chains = []cluster.Chain{{Name: "audit", Table: tg.Prefix + "audit"}}
			c.WitnessFile = filepath.Join(t.TempDir(), "witness.json") // AdvanceTip reads the tip first
		})
		waitFor(t, 5*time.Second, "a to lead", a.IsLeader)
		calls := map[string]func(tx cluster.Tx) error{
			"Fence":      func(tx cluster.Tx) error { _, err := a.Fence(ctx, tx); return err },
			"ClaimLane":  func(tx cluster.Tx) error { _, err := a.ClaimLane(ctx, tx, "orders-1"); return err },
			"AdvanceTip": func(tx cluster.Tx) error { return a.AdvanceTip(ctx, tx, "audit", 1, []byte{1}) },
		}
		for name, call := range calls {
			for _, tx := range []cluster.Tx{nil, (*sql.Tx)(nil), (*sql.Conn)(nil)} {
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Fatalf("%s(%T) panics: %v", name, tx, r)
						}
					}()
					if err := call(tx); !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), name+" needs the transaction") {
						t.Errorf("%s(%T) = %v; want ErrInvalidConfig naming the call", name, tx, err)
					}
				}()
			}
		}
		// A Tx that cannot read rows (neither database/sql's nor a
		// provider.Querier) is refused with the fix, not run.
		for name, err := range map[string]error{
			"Fence":      func() error { _, err := a.Fence(ctx, execOnly{}); return err }(),
			"ClaimLane":  func() error { _, err := a.ClaimLane(ctx, execOnly{}, "orders-1"); return err }(),
			"AdvanceTip": a.AdvanceTip(ctx, execOnly{}, "audit", 1, []byte{1}),
		} {
			if !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), name+" cannot read rows through a cluster_test.execOnly") {
				t.Errorf("%s(execOnly) = %v; want ErrInvalidConfig naming the call and the type", name, err)
			}
		}
		if !a.IsLeader() {
			t.Fatal("a no longer leads after the calls with no transaction")
		}

		// A follower gets the same error, not ErrNotLeader, and a nil
		// ClaimLane does not make it a lane member.
		f := start(t, tg, "f", func(c *cluster.Config) {
			c.Chains = []cluster.Chain{{Name: "audit", Table: tg.Prefix + "audit"}}
		})
		for name, err := range map[string]error{
			"Fence":      func() error { _, err := f.Fence(ctx, (*sql.Tx)(nil)); return err }(),
			"ClaimLane":  func() error { _, err := f.ClaimLane(ctx, nil, "orders-1"); return err }(),
			"AdvanceTip": f.AdvanceTip(ctx, nil, "audit", 1, []byte{1}),
		} {
			if !errors.Is(err, cluster.ErrInvalidConfig) || errors.Is(err, cluster.ErrNotLeader) || !strings.Contains(err.Error(), name+" needs the transaction") {
				t.Errorf("follower's %s(nil) = %v; want ErrInvalidConfig naming %s", name, err, name)
			}
		}
		time.Sleep(3 * testdb.Heartbeat)
		var takes int
		if err := tg.Open(t).QueryRowContext(ctx, bind(tg.Dialect, "SELECT takes_lanes FROM "+tg.Prefix+"nodes WHERE node_id = ?"), "f").Scan(&takes); err != nil || takes != 0 {
			t.Errorf("after a nil ClaimLane the follower's takes_lanes = %d (%v); want 0", takes, err)
		}
	})
}

func TestFenceNeedsDatabaseProvider(t *testing.T) {
	t.Parallel()
	c := startFake(t, &fakeProvider{})
	if _, err := c.Fence(context.Background(), (*sql.DB)(nil)); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("Fence with a custom provider = %v", err)
	}
}

// Fenced writers on two nodes run through a forced takeover. Every stale
// write must be refused, and the tokens of committed writes, taken in
// commit order, must never decrease.
func TestFencedWritersAcrossTakeover(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		setup := tg.Open(t)
		createWriteLog(t, tg, setup)

		// a renews slowly, so it keeps believing it leads for a while after
		// the database moved on; b polls fast and takes over at once.
		a := start(t, tg, "a", slowRenew)
		b := start(t, tg, "b")
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}

		var refused atomic.Int64
		committed := map[string]*atomic.Int64{"a": {}, "b": {}}
		var stop atomic.Bool
		var wg sync.WaitGroup
		for _, n := range []*node{a, a, b, b} {
			wg.Go(func() {
				for !stop.Load() {
					if !n.IsLeader() {
						time.Sleep(time.Millisecond) // pacing the poll
						continue
					}
					err := fencedWrite(context.Background(), n.db, n.Fence, tg.Dialect, tg.Prefix, n.NodeID())
					time.Sleep(time.Millisecond) // leave the lease row a chance
					switch {
					case err == nil:
						committed[n.NodeID()].Add(1)
					case errors.Is(err, cluster.ErrStaleFencingToken):
						refused.Add(1)
					}
					// Other errors (lock timeouts, a busy file) are retried.
				}
			})
		}
		waitFor(t, 5*time.Second, "a's writes to commit", func() bool { return committed["a"].Load() > 0 })
		expireLease(t, tg, setup) // a is "paused" past its TTL
		waitFor(t, 5*time.Second, "b to take over", b.IsLeader)
		waitFor(t, 5*time.Second, "a to notice", func() bool { return !a.IsLeader() })
		waitFor(t, 5*time.Second, "b's writes to commit", func() bool { return committed["b"].Load() > 0 })
		stop.Store(true)
		wg.Wait()

		byNode := map[string]int{}
		for _, w := range readWriteLog(t, tg, setup) {
			byNode[w.node]++
		}
		t.Logf("%d committed (%v), %d stale writes refused by the database", committed["a"].Load()+committed["b"].Load(), byNode, refused.Load())
		if byNode["a"] == 0 || byNode["b"] == 0 {
			t.Fatalf("want commits from both leaders, got %v", byNode)
		}
		if refused.Load() == 0 {
			t.Fatal("no stale write was refused: the takeover window was not exercised")
		}
	})
}

// On MariaDB, Fence never holds the lease row locked while the session
// lacks an idle limit of at most LeaseTTL (idle_transaction_timeout, and
// idle_write_transaction_timeout and idle_readonly_transaction_timeout,
// which take precedence when set): the server picks
// the idle limit each time it waits for the client's next statement, so a
// lock taken before the limit would leave that wait unbounded, and a
// client that vanished right then would keep the row locked, and every
// node from leading, for hours. After every statement Fence sends, the
// test checks from another connection that the row is free unless the
// limit is in place. A session that has the limit (it fenced before) is
// fenced in one statement; one without it in three (a read that locks
// nothing, the SET, the read). The SET has no arguments, so
// go-sql-driver/mysql sends it as text in one round trip. A shorter limit
// the application chose is kept.
func TestMariaDBFenceBoundsIdleBeforeLocking(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.MySQL)
	ctx := context.Background()
	a := start(t, tg, "a")
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	var version string
	if err := a.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(version, "MariaDB") {
		t.Skipf("%s is not MariaDB: MySQL has no idle_transaction_timeout to set", version)
	}
	conn, err := a.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	other := tg.Open(t)
	status := func(name string) int {
		t.Helper()
		var n int
		if err := conn.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE '"+name+"'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The three idle limits: MariaDB ends a transaction that wrote after
	// idle_write_transaction_timeout and a read-only one after
	// idle_readonly_transaction_timeout when those are not 0, else after
	// idle_transaction_timeout.
	type limits struct{ any, write, readonly int }
	idle := func() limits {
		t.Helper()
		var l limits
		if err := conn.QueryRowContext(ctx, "SELECT @@session.idle_transaction_timeout, @@session.idle_write_transaction_timeout, @@session.idle_readonly_transaction_timeout").Scan(&l.any, &l.write, &l.readonly); err != nil {
			t.Fatal(err)
		}
		return l
	}
	locked := func() bool { t.Helper(); return leaseLocked(t, tg, other) }
	want := int((testdb.LeaseTTL + time.Second - 1) / time.Second)
	bounded := func(l limits) bool {
		return l.any >= 1 && l.any <= want && l.write >= 0 && l.write <= want && l.readonly >= 0 && l.readonly <= want
	}
	type setting struct {
		before, after limits
		statements    int
		what          string
	}
	cases := []setting{
		{limits{0, 0, 0}, limits{want, 0, 0}, 3, "unset: Fence sets it"},
		{limits{want, 0, 0}, limits{want, 0, 0}, 1, "already LeaseTTL: one statement"},
		{limits{want + 3, 0, 0}, limits{want, 0, 0}, 3, "longer than LeaseTTL: Fence shortens it"},
		{limits{want, 100, 0}, limits{want, want, 0}, 3, "idle_write_transaction_timeout longer: Fence shortens it"},
		{limits{want, 0, 100}, limits{want, 0, want}, 3, "idle_readonly_transaction_timeout longer: Fence shortens it"},
		{limits{0, want, want}, limits{want, want, want}, 3, "only the specific ones set: Fence sets the general one"},
	}
	if want > 1 {
		cases = append(cases, setting{limits{want - 1, want - 1, 0}, limits{want - 1, want - 1, 0}, 1, "shorter, as the application chose: kept"})
	}
	for _, c := range cases {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION idle_transaction_timeout = %d, idle_write_transaction_timeout = %d, idle_readonly_transaction_timeout = %d",
			c.before.any, c.before.write, c.before.readonly)); err != nil {
			t.Fatal(err)
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		prepared := status("Com_stmt_prepare")
		rec := &recordingTx{tx: tx, after: func(query string) {
			if l := idle(); !bounded(l) && locked() {
				t.Errorf("%s: after %q the lease row is locked while the idle limits are %+v", c.what, query, l)
			}
		}}
		if _, err := a.Fence(ctx, rec); err != nil {
			t.Fatal(err)
		}
		reads := 0
		for _, q := range rec.queries {
			if strings.Contains(q, "LOCK IN SHARE MODE") {
				reads++
			}
		}
		if n := status("Com_stmt_prepare") - prepared; n > reads { // 0 with interpolateParams=true in the DSN
			t.Errorf("%s: Fence prepared %d statements, want at most %d (the lease reads)", c.what, n, reads)
		}
		switch n := len(rec.queries); {
		case n != c.statements || !strings.Contains(rec.queries[n-1], "LOCK IN SHARE MODE"):
			t.Errorf("%s: Fence sent %q; want %d statements, the last the lease read", c.what, rec.queries, c.statements)
		case n == 3 && !strings.HasPrefix(rec.queries[1], "SET SESSION idle_transaction_timeout"):
			t.Errorf("%s: Fence sent %q; want the idle limit set before the second read", c.what, rec.queries)
		}
		if !locked() {
			t.Errorf("%s: the lease row is not locked after Fence", c.what)
		}
		if got := idle(); got != c.after {
			t.Errorf("%s: idle limits (any, write, read-only) = %+v after Fence, want %+v (LeaseTTL %v rounded up)", c.what, got, c.after, testdb.LeaseTTL)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}

	// Fence in a transaction of a.db runs the read the provider prepared
	// at the first Fence (server-side). MariaDB must decide its condition on the session's
	// limit at each run, not when the statement was prepared: on a session
	// without the limit the prepared read returns no row and locks nothing.
	warm, err := a.db.BeginTx(ctx, nil) // the first Fence in a transaction of a.db prepares the reads
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Fence(ctx, warm); err != nil {
		t.Fatal(err)
	}
	warm.Rollback()
	q := cluster.FenceQuery(a.Cluster)
	if q == "" {
		t.Fatal("the provider prepared no fence read")
	}
	stmt, err := conn.PrepareContext(ctx, q) // go-sql-driver/mysql prepares on the server, interpolateParams or not
	if err != nil {
		t.Fatal(err)
	}
	defer stmt.Close()
	for _, limit := range []int{want, 0, want, 0} {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION idle_transaction_timeout = %d, idle_write_transaction_timeout = 0, idle_readonly_transaction_timeout = 0", limit)); err != nil {
			t.Fatal(err)
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var holder, instance, endpoint string
		var token, expires, now int64
		err = tx.StmtContext(ctx, stmt).QueryRowContext(ctx, "leader").Scan(&holder, &instance, &token, &expires, &endpoint, &now)
		switch {
		case limit > 0 && err != nil:
			t.Errorf("the prepared read on a session with the limit (%ds): %v; want the lease row", limit, err)
		case limit == 0 && !errors.Is(err, sql.ErrNoRows):
			t.Errorf("the prepared read on a session without the limit: %v; want no row", err)
		}
		if l := locked(); l != (limit > 0) {
			t.Errorf("idle limit %ds: the lease row is locked: %v after the prepared read; want %v", limit, l, limit > 0)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}
	conn.ExecContext(ctx, fmt.Sprintf("SET SESSION idle_transaction_timeout = %d", want))
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := a.Fence(ctx, tx); err != nil {
		t.Fatalf("Fence through the prepared read: %v", err)
	}
	if !locked() {
		t.Error("the lease row is not locked after Fence through the prepared read")
	}
}

var errTouched = errors.New("untouchedTx: a statement ran in a transaction that should not have been touched")

func (untouchedTx) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, errTouched
}
func (untouchedTx) Exec(context.Context, string, ...any) (int64, error) { return 0, errTouched }
func (untouchedTx) QueryRow(context.Context, string, ...any) provider.Row {
	return touchedRow{}
}

type touchedRow struct{}

func (touchedRow) Scan(...any) error { return errTouched }

// execOnly is a Tx that can only Exec: no Querier, no database/sql handle.
type execOnly struct{}

func (execOnly) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, errors.New("execOnly runs nothing")
}

// afterScan is a row that runs after once it is scanned (and its
// statement done with the connection).
type afterScan struct {
	row   *sql.Row
	after func()
}

func (a afterScan) Scan(dest ...any) error {
	err := a.row.Scan(dest...)
	a.after()
	return err
}

// A follower's attempt on a held lease neither locks the lease row nor
// waits for it: a leader's fenced transaction, which holds the row FOR
// SHARE until it ends, does not stall the followers' attempts (through a
// transaction pooler each stalled attempt would hold a server connection),
// and refused attempts do not queue the leader's renews behind them.
// The attempt reads the row first, without a lock: on PostgreSQL INSERT
// ... ON CONFLICT DO UPDATE locks the conflicting row even when its WHERE
// refuses the update, on MySQL an UPDATE locks the row its key finds, and
// on SQLite any write waits for the one write lock a fenced transaction
// holds.
func TestRefusedAcquireDoesNotWaitForFence(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, refusedAcquireDoesNotWaitForFence)
}

func refusedAcquireDoesNotWaitForFence(t *testing.T, tg testdb.Target) {
	ctx := context.Background()
	a := start(t, tg, "a")
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := a.Fence(ctx, tx); err != nil {
		t.Fatal(err)
	}
	p, err := cluster.NewDBProvider(tg.Open(t), tg.Dialect, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	began := time.Now()
	_, err = p.Acquire(actx, provider.LeaseRequest{Name: "leader", Holder: "b", Instance: "b-instance", TTL: testdb.LeaseTTL})
	took := time.Since(began)
	var held *cluster.LeaseHeldError
	if !errors.As(err, &held) || held.Holder != "a" {
		t.Fatalf("an attempt while a's fenced transaction is open returned %v after %v, want the lease held by a", err, took)
	}
	if took > time.Second {
		t.Errorf("the refused attempt took %v: it waited for the fenced transaction", took)
	}
}

// On SQLite and MySQL, Fence in a transaction of the node's *sql.DB runs
// its read through a statement the provider prepared at the first Fence: on MySQL one round trip on a
// connection that ran it before, where go-sql-driver/mysql otherwise
// prepares, runs and closes it (two), unless the DSN interpolates. A
// transaction of another *sql.DB on the same database is fenced all the
// same, with the read's text.
func TestFencePreparesItsReadOnce(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		if tg.Dialect == cluster.Postgres {
			t.Skip("pgx caches PostgreSQL's prepared statements itself")
		}
		ctx := context.Background()
		db := tg.Open(t)
		if tg.Dialect == cluster.MySQL {
			// Without interpolateParams, which would spare the text's
			// prepare too.
			cfg, err := mysqldrv.ParseDSN(tg.DSN)
			if err != nil {
				t.Fatal(err)
			}
			cfg.InterpolateParams = false
			if db, err = sql.Open("mysql", cfg.FormatDSN()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
		}
		a := startOn(t, tg, db, "a", slowRenew)
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		// The provider prepares the reads at its first Fence, on a
		// goroutine of its own (the fence's transaction holds a
		// connection): wait for that.
		warm, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Fence(ctx, warm); err != nil {
			t.Fatal(err)
		}
		warm.Rollback()
		if cluster.FenceQuery(a.Cluster) == "" {
			t.Fatal("the provider prepared no fence read at a's first Fence")
		}
		// Every transaction on one connection of db (a's renews take
		// others).
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		prepares := func(tx *sql.Tx) int {
			t.Helper()
			if tg.Dialect != cluster.MySQL {
				return 0
			}
			var name string
			var n int
			if err := tx.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_stmt_prepare'").Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		// With no deadline, and with deadlines that give the read a time
		// limit of the lease's TTL and of less (rounded down to 512 ms):
		// each prepared once on the connection, then run.
		var first uint64
		for _, timeout := range []time.Duration{0, time.Hour, time.Second} {
			for i := range 3 {
				fctx, cancel := ctx, context.CancelFunc(func() {})
				if timeout > 0 {
					fctx, cancel = context.WithTimeout(ctx, timeout)
				}
				tx, err := conn.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				before := prepares(tx)
				token, err := a.Fence(fctx, tx)
				cancel()
				if err != nil {
					t.Fatalf("Fence %d with timeout %v: %v", i+1, timeout, err)
				}
				if first == 0 {
					first = token
				} else if token != first {
					t.Fatalf("Fence %d with timeout %v returned token %d, then %d", i+1, timeout, first, token)
				}
				if n := prepares(tx) - before; i > 0 && n != 0 {
					t.Errorf("Fence %d with timeout %v prepared %d statements on a connection that fenced so before; want none", i+1, timeout, n)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
			}
		}

		other := tg.Open(t)
		tx, err := other.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if token, err := a.Fence(ctx, tx); err != nil || token != first {
			t.Fatalf("Fence in a transaction of another *sql.DB = %d, %v; want %d, nil", token, err, first)
		}
	})
}

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
