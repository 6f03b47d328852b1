package clusterpgx_test

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

// The tests in this file run clusterpgx over pgxpools through PgBouncer in
// transaction mode (CLUSTER_TEST_PGBOUNCER_DSN), with
// default_query_exec_mode=exec (testdb.PgBouncerSettings).

func TestPgBouncerConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, func(t *testing.T) func() provider.Provider {
		tg := testdb.PgBouncer(t)
		return func() provider.Provider {
			p := pgxProvider(t, tg, newPool(t, tg, 0))
			if err := p.Init(context.Background()); err != nil {
				t.Fatal(err)
			}
			return p
		}
	})
}

// sendTo returns a Config edit that applies edit (if any) and sends the
// node's transitions to ch. Sends never block: a test gives ch room for
// more events than it makes.
func sendTo(ch chan<- cluster.Event, edit func(*cluster.Config)) func(*cluster.Config) {
	return func(c *cluster.Config) {
		c.Events = ch
		if edit != nil {
			edit(c)
		}
	}
}

// waitEvent returns the next event of kind from ch, failing the test after
// timeout.
func waitEvent(t *testing.T, ch <-chan cluster.Event, kind cluster.EventKind, timeout time.Duration) cluster.Event {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case e := <-ch:
			if e.Kind == kind {
				return e
			}
		case <-deadline:
			t.Fatalf("no %s event in %v", kind, timeout)
		}
	}
}

// bouncerNode is node behind PgBouncer in transaction mode, configured as
// the README says: Config.PollOnly, since a LISTEN there leaves a server
// connection listening that no client owns. (PgBouncer 1.18 was seen to
// stop with "server in bad state" when a release's notification reached
// such a connection while a cancel request was in progress.)
func bouncerNode(t *testing.T, tg testdb.Target, pool *pgxpool.Pool, id string, edit func(*cluster.Config)) *cluster.Cluster {
	t.Helper()
	return node(t, tg, pool, id, func(c *cluster.Config) {
		c.PollOnly = true
		if edit != nil {
			edit(c)
		}
	})
}

// Three nodes on pools of their own elect one leader, every node reads the
// same leader, and the leader hands off when it shuts down.
func TestPgBouncerElection(t *testing.T) {
	t.Parallel()
	tg := testdb.PgBouncer(t)
	ctx := context.Background()
	// A long TTL: the handoff must come from the release, not expiry.
	long := func(c *cluster.Config) {
		c.LeaseTTL, c.FenceTimeout = 10*time.Second, 5*time.Second
	}
	eventsA, others := make(chan cluster.Event, 64), make(chan cluster.Event, 64)
	a := bouncerNode(t, tg, newPool(t, tg, 0), "a", sendTo(eventsA, long))
	b := bouncerNode(t, tg, newPool(t, tg, 0), "b", sendTo(others, long))
	c := bouncerNode(t, tg, newPool(t, tg, 0), "c", sendTo(others, long))
	if !a.IsLeader() || b.IsLeader() || c.IsLeader() {
		t.Fatalf("want a alone to lead; a %v, b %v, c %v", a.IsLeader(), b.IsLeader(), c.IsLeader())
	}
	token := a.FencingToken()
	for _, n := range []*cluster.Cluster{a, b, c} {
		l, err := n.CurrentLeader(ctx)
		if err != nil || l == nil || l.NodeID != "a" || l.FencingToken != token {
			t.Fatalf("%s: CurrentLeader = %+v, %v; want a with token %d", n.NodeID(), l, err, token)
		}
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if e := waitEvent(t, eventsA, cluster.EventLeaseReleased, time.Second); e.Reason != cluster.ReasonShutdown {
		t.Fatalf("released event = %+v", e)
	}
	// Well before a's 10s lease could expire.
	next := waitEvent(t, others, cluster.EventLeaseAcquired, 3*time.Second)
	if next.FencingToken <= token {
		t.Fatalf("%s took over with token %d, want above %d", next.NodeID, next.FencingToken, token)
	}
	if b.IsLeader() == c.IsLeader() {
		t.Fatalf("want one of b and c to lead; b %v, c %v", b.IsLeader(), c.IsLeader())
	}
}

// A leader whose pool is gone stops believing it leads, and another node
// takes over once its lease expires.
func TestPgBouncerTakeoverAfterCrash(t *testing.T) {
	t.Parallel()
	tg := testdb.PgBouncer(t)
	poolA := newPool(t, tg, 0)
	eventsA, eventsB := make(chan cluster.Event, 64), make(chan cluster.Event, 64)
	a := bouncerNode(t, tg, poolA, "a", sendTo(eventsA, nil))
	bouncerNode(t, tg, newPool(t, tg, 0), "b", sendTo(eventsB, nil))
	old := a.FencingToken()
	if old == 0 {
		t.Fatal("first node does not lead after New")
	}
	poolA.Close() // the crash: no release
	if e := waitEvent(t, eventsA, cluster.EventLeaseLost, 3*time.Second); e.Reason != cluster.ReasonSelfFenced {
		t.Fatalf("lost event = %+v, want self-fenced", e)
	}
	if e := waitEvent(t, eventsB, cluster.EventLeaseAcquired, 5*time.Second); e.FencingToken <= old {
		t.Fatalf("token after the takeover = %d, want above %d", e.FencingToken, old)
	}
}

// Through PgBouncer, a leader's pgx transaction is fenced and advances a
// chain tip, and a stale leader's is refused by the database.
func TestPgBouncerFenceAcrossTakeover(t *testing.T) {
	t.Parallel()
	tg := testdb.PgBouncer(t)
	ctx := context.Background()
	poolA, poolB := newPool(t, tg, 0), newPool(t, tg, 0)
	if _, err := poolA.Exec(ctx, "CREATE TABLE "+tg.Prefix+"orders (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL, node TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := poolA.Exec(ctx, "CREATE TABLE "+tg.Prefix+"audit (monotonic_counter BIGINT PRIMARY KEY, row_hash BYTEA NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	chains := func(c *cluster.Config) {
		c.Chains = []cluster.Chain{{Name: "audit", Table: tg.Prefix + "audit"}}
		// a renews rarely, so it still believes it leads after the takeover.
		c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 5*time.Second, 2*time.Second, 4*time.Second
	}
	a := bouncerNode(t, tg, poolA, "a", chains)
	write := func(c *cluster.Cluster, pool *pgxpool.Pool, counter uint64) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		token, err := c.Fence(ctx, clusterpgx.Tx(tx))
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+tg.Prefix+"orders (token, node) VALUES ($1, $2)", int64(token), c.NodeID()); err != nil {
			t.Fatal(err)
		}
		hash := []byte{byte(counter), 0xfe}
		if _, err := tx.Exec(ctx, "INSERT INTO "+tg.Prefix+"audit (monotonic_counter, row_hash) VALUES ($1, $2)", int64(counter), hash); err != nil {
			t.Fatal(err)
		}
		if err := c.AdvanceTip(ctx, clusterpgx.Tx(tx), "audit", counter, hash); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := write(a, poolA, 1); err != nil {
		t.Fatalf("fenced write by the leader: %v", err)
	}
	if _, err := poolB.Exec(ctx, "UPDATE "+tg.Prefix+"lease SET expires_at = 0"); err != nil {
		t.Fatal(err)
	}
	b := bouncerNode(t, tg, poolB, "b", chains)
	if !b.IsLeader() || !a.IsLeader() {
		t.Fatalf("setup: want both to believe they lead; a %v, b %v", a.IsLeader(), b.IsLeader())
	}
	if err := write(a, poolA, 2); !errors.Is(err, cluster.ErrStaleFencingToken) {
		t.Fatalf("fenced write by the stale leader = %v, want ErrStaleFencingToken", err)
	}
	tx, err := poolA.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = a.AdvanceTip(ctx, clusterpgx.Tx(tx), "audit", 2, []byte{2})
	tx.Rollback(ctx)
	if !errors.Is(err, cluster.ErrStaleFencingToken) {
		t.Fatalf("AdvanceTip by the stale leader = %v, want ErrStaleFencingToken", err)
	}
	if err := write(b, poolB, 2); err != nil {
		t.Fatalf("fenced write by the new leader: %v", err)
	}
	var n int
	if err := poolB.QueryRow(ctx, "SELECT COUNT(*) FROM "+tg.Prefix+"orders").Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d orders committed (%v), want the leaders' two", n, err)
	}
}

// Which pgx settings work through PgBouncer in transaction mode: each of
// testdb.PgxSettings runs a short election with fenced writers, one after
// the other, so as not to crowd the timing-sensitive tests beside them.
func TestPgBouncerPgxSettings(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.PgxSettings {
		t.Run(cmp.Or(s.Params, "default"), func(t *testing.T) {
			tg := testdb.PgBouncer(t)
			tg.DSN = tg.WithPgxSettings(t, s.Params)
			err := bouncerWorkload(t, tg)
			switch {
			case len(s.Fails) == 0 && err != nil:
				t.Fatalf("with %q: %v", s.Params, err)
			case len(s.Fails) > 0 && err == nil:
				t.Fatalf("with %q the package worked, but it should fail with %q: is this PgBouncer 1.21 or later with max_prepared_statements, or in session mode? Then update testdb.PgxSettings and the README", s.Params, s.Fails)
			case len(s.Fails) > 0 && !containsAny(err.Error(), s.Fails):
				t.Fatalf("with %q: %v; want an error with one of %q", s.Params, err, s.Fails)
			case err != nil:
				t.Logf("fails as expected: %v", err)
			}
		})
	}
}

// bouncerWorkload runs three nodes on pools of their own for 2s, each
// fencing pgx transactions from two goroutines while it leads and reading
// the leader otherwise, and returns the first error: New's, a failed
// provider call's (acquire, renew, release, fence) or a fenced write's, or
// nil.
func bouncerWorkload(t *testing.T, tg testdb.Target) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var once sync.Once
	var first error
	fail := func(err error) {
		once.Do(func() { first = err })
		cancel()
	}
	setup := newPool(t, tg, 0)
	if _, err := setup.Exec(ctx, "CREATE TABLE "+tg.Prefix+"orders (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL, node TEXT NOT NULL)"); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b", "c"} {
		pool := newPool(t, tg, 0)
		p, err := clusterpgx.NewProviderWithPrefix(pool, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		c, err := cluster.New(ctx, cluster.Config{
			NodeID:            id,
			Provider:          p,
			PollOnly:          true, // no LISTEN through a transaction pooler (bouncerNode)
			LeaseTTL:          time.Second,
			HeartbeatInterval: 100 * time.Millisecond,
			FenceTimeout:      700 * time.Millisecond,
			Logger:            testdb.Logger(t),
			Observer: func(op cluster.Operation) {
				// A follower's attempt may wait out its timeout behind the
				// leader's fenced transactions, which hold the lease row.
				waited := op.Kind == cluster.OpAcquire && errors.Is(op.Err, context.DeadlineExceeded)
				if op.Outcome == cluster.OutcomeError && !waited && ctx.Err() == nil {
					fail(op.Err)
				}
			},
		})
		if err != nil {
			fail(err)
			break
		}
		t.Cleanup(func() { c.Shutdown(context.Background()) })
		for range 2 {
			wg.Go(func() {
				for ctx.Err() == nil {
					var err error
					read := !c.IsLeader()
					if read {
						_, err = c.CurrentLeader(ctx)
					} else {
						err = fencedInsert(ctx, c, pool, tg.Prefix)
					}
					// A read bounded by one heartbeat may time out on a loaded
					// machine; what this test looks for is a setting that fails.
					slowRead := read && errors.Is(err, context.DeadlineExceeded)
					if err != nil && ctx.Err() == nil && !errors.Is(err, cluster.ErrStaleFencingToken) && !slowRead {
						fail(err)
					}
					time.Sleep(5 * time.Millisecond) // leave the lease row a chance
				}
			})
		}
	}
	wg.Wait()
	var n int
	if err := setup.QueryRow(context.Background(), "SELECT COUNT(*) FROM "+tg.Prefix+"orders").Scan(&n); first == nil && (err != nil || n == 0) {
		return errors.Join(errors.New("no fenced write committed"), err)
	}
	return first
}

// fencedInsert inserts an order in a pgx transaction fenced by c.
func fencedInsert(ctx context.Context, c *cluster.Cluster, pool *pgxpool.Pool, prefix string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	token, err := c.Fence(ctx, clusterpgx.Tx(tx))
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+prefix+"orders (token, node) VALUES ($1, $2)", int64(token), c.NodeID()); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
