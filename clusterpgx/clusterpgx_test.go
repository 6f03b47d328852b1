package clusterpgx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check exits after Close returns.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

// newPool opens a pgxpool on the test database, closed when the test ends.
func newPool(t *testing.T, tg testdb.Target, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(tg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func pgxProvider(t *testing.T, tg testdb.Target, pool *pgxpool.Pool) *cluster.DBProvider {
	t.Helper()
	p, err := clusterpgx.NewProviderWithPrefix(pool, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The pgx provider passes the conformance suite every provider must.
func TestConformance(t *testing.T) {
	providertest.Run(t, func(t *testing.T) func() provider.Provider {
		tg := testdb.New(t, cluster.Postgres)
		return func() provider.Provider {
			p := pgxProvider(t, tg, newPool(t, tg, 0))
			if err := p.Init(context.Background()); err != nil {
				t.Fatal(err)
			}
			return p
		}
	})
}

func node(t *testing.T, tg testdb.Target, pool *pgxpool.Pool, id string, edit func(*cluster.Config)) *cluster.Cluster {
	t.Helper()
	cfg := cluster.Config{
		NodeID:            id,
		Provider:          pgxProvider(t, tg, pool),
		LeaseTTL:          time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		FenceTimeout:      700 * time.Millisecond,
		Logger:            testdb.Logger(t),
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", id, err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	return c
}

// A service on pgxpool and pgx transactions alone elects a leader, fences
// its writes and chain tips, and a stale leader's pgx transaction is
// refused by the database after a forced takeover.
func TestFenceAcrossTakeover(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
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
	a := node(t, tg, poolA, "a", chains)
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
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

	// Force a takeover behind a's back: its lease ends in the database.
	if _, err := poolB.Exec(ctx, "UPDATE "+tg.Prefix+"lease SET expires_at = 0"); err != nil {
		t.Fatal(err)
	}
	b := node(t, tg, poolB, "b", chains)
	if !b.IsLeader() || b.FencingToken() <= a.FencingToken() {
		t.Fatalf("b leads %v with token %d after a's %d", b.IsLeader(), b.FencingToken(), a.FencingToken())
	}
	if !a.IsLeader() {
		t.Fatal("a noticed too soon; the test needs a stale leader that still believes")
	}
	if err := write(a, poolA, 2); !errors.Is(err, cluster.ErrStaleFencingToken) {
		t.Fatalf("fenced write by the stale leader = %v, want ErrStaleFencingToken", err)
	}
	// Without Fence, the chain-tip trigger refuses it on its own.
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
		t.Fatalf("%d orders committed (%v), want the leader's two", n, err)
	}
}

// An exhausted pgxpool is reported as such, with what to do.
func TestPoolExhausted(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	pool := newPool(t, tg, 1)
	p := pgxProvider(t, tg, pool)
	if err := p.Init(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = p.Acquire(actx, provider.LeaseRequest{Name: "leader", Holder: "a", Instance: "i", TTL: time.Second})
	if !errors.Is(err, cluster.ErrPoolExhausted) {
		t.Fatalf("Acquire with the pool exhausted = %v, want ErrPoolExhausted", err)
	}
	t.Log(err)
}
