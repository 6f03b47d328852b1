package cluster_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// A follower pinned to a read-only replica starts when the tables exist:
// New runs no DDL on a current schema, and the follower's one write, its
// membership, is refused once at Init and not tried again.
func TestFollowerStartsOnReadOnlyReplica(t *testing.T) {
	t.Parallel()
	fp := strings.Repeat("5a", cluster.VaultKeyFingerprintLen/2)
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		withKeys := func(c *cluster.Config) { c.VaultKeyFingerprint = fp }
		a := start(t, tg, "a", withKeys)
		ro := tg.OpenDSN(t, tg.ReadOnlyDSN(t))
		if _, err := ro.ExecContext(ctx, "CREATE TABLE "+tg.Prefix+"probe (x INTEGER)"); err == nil {
			t.Fatal("the read-only connection accepted DDL; the test would prove nothing")
		}
		p, err := cluster.NewDBProvider(ro, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		joins := &countedJoins{DBProvider: p}
		f := startOn(t, tg, ro, "f", withKeys, func(c *cluster.Config) { c.Role, c.Provider = cluster.RoleFollower, joins })
		l, err := f.CurrentLeader(ctx)
		if err != nil || l == nil || l.NodeID != "a" || l.FencingToken != a.FencingToken() {
			t.Fatalf("follower on the replica reads leader %+v, %v; want a with token %d", l, err, a.FencingToken())
		}
		// Its join at Init was refused as read-only, which no later join
		// changes: it does not try again at every poll.
		time.Sleep(10 * testdb.Heartbeat)
		if n := joins.n.Load(); n != 1 {
			t.Errorf("the follower on the replica tried to join %d times in ten heartbeats; want 1 (at Init)", n)
		}
	})
}

// countedJoins counts the membership joins a node tries.
type countedJoins struct {
	*cluster.DBProvider
	n atomic.Int32
}

func (p *countedJoins) Join(ctx context.Context, scope string, m cluster.Member) error {
	p.n.Add(1)
	return p.DBProvider.Join(ctx, scope, m)
}

// Starting a node while a fenced transaction is open neither waits for it
// nor makes other nodes' lease reads wait: a current schema gets no DDL.
func TestNewDoesNotQueueBehindFencedTransaction(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		reader := start(t, tg, "reader", func(c *cluster.Config) { c.Role = cluster.RoleFollower })
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := a.Fence(ctx, tx); err != nil {
			t.Fatal(err)
		}

		started := make(chan error, 1)
		begin := time.Now()
		go func() {
			cfg := tg.Config(t, tg.Open(t), "b")
			c, err := cluster.New(ctx, cfg)
			if err == nil {
				c.Shutdown(ctx)
			}
			started <- err
		}()
		if tg.Dialect != cluster.SQLite { // SQLite readers never wait for a writer
			time.Sleep(300 * time.Millisecond) // let b reach its schema check; nothing inside New signals it
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := reader.CurrentLeader(rctx)
			cancel()
			if err != nil {
				t.Errorf("a lease read while b starts behind the fenced transaction: %v", err)
			}
		}
		select {
		case err := <-started:
			if err != nil {
				t.Fatalf("New(b) while a fenced transaction is open: %v", err)
			}
			t.Logf("New(b) returned after %v", time.Since(begin).Round(time.Millisecond))
		case <-time.After(4 * time.Second):
			tx.Rollback()
			<-started
			t.Fatalf("New(b) waited for the fenced transaction (still waiting after 4s)")
		}
	})
}

// A leader whose host vanishes inside a fenced transaction blocks a
// takeover for about one LeaseTTL, not until the server notices the dead
// connection: Fence bounds the transaction's idle time on the server.
func TestTakeoverAfterLeaderVanishesInFencedTransaction(t *testing.T) {
	t.Parallel()
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} { // SQLite has no network to lose
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			tg := testdb.New(t, d)
			ctx := context.Background()
			proxy := testdb.NewProxy(t, tg.Addr(t))
			a := startOn(t, tg, tg.OpenDSN(t, tg.WithAddr(t, proxy.Addr)), "a")
			if !a.IsLeader() {
				t.Fatal("a does not lead")
			}
			b := start(t, tg, "b")
			tx, err := a.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Fence(ctx, tx); err != nil {
				t.Fatal(err)
			}
			proxy.Block() // a's host vanishes, its transaction open
			vanished := time.Now()
			ttl := testdb.LeaseTTL
			bound := 2*ttl + time.Second
			took := waitFor(t, bound, "b to take over from a leader that vanished inside a fenced transaction", b.IsLeader)
			t.Logf("b took over %v after a vanished (LeaseTTL %v)", took.Round(time.Millisecond), ttl)
			if b.FencingToken() <= 1 {
				t.Fatalf("b leads with token %d", b.FencingToken())
			}
			_ = vanished
			proxy.Close() // a's connections die; its rollback returns at once
			tx.Rollback()
		})
	}
}

// On MySQL a lease statement never outlives the attempt that sent it: with
// a fenced transaction holding the lease row, the followers' cancelled
// attempts do not pile up on the server waiting for the lock.
func TestMySQLLeaseStatementsEndWithTheirAttempt(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.MySQL)
	ctx := context.Background()
	a := start(t, tg, "a")
	start(t, tg, "b")
	start(t, tg, "c")
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := a.Fence(ctx, tx); err != nil {
		t.Fatal(err)
	}
	const attempts = 25 * testdb.Heartbeat
	time.Sleep(attempts) // a sleep: about 25 attempts per node, to pile up if they would
	var waiting, old int
	err = tg.Open(t).QueryRowContext(ctx,
		"SELECT COUNT(*), COALESCE(SUM(TIME >= 1), 0) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND INFO NOT LIKE '%PROCESSLIST%'",
		"%"+tg.Prefix+"lease%").Scan(&waiting, &old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("lease statements on the server after %v behind a fenced transaction: %d, %d of them older than 1s", attempts, waiting, old)
	if old > 0 || waiting > 3 {
		t.Fatalf("%d lease statements wait on the server (%d older than 1s); want at most one per node, none older than its attempt", waiting, old)
	}
}
