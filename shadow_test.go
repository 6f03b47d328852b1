package cluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// shadowStatements make, on one database session, temporary copies of the
// cluster tables that say something else: the lease held by a ghost under
// a higher token for an hour, lane "k" the ghost's too, the config version
// at 1000, and no high-water marks. PostgreSQL and SQLite look temporary
// tables up before the schema's, so a statement of the package that names
// a table without its schema would read and write the copy on that
// session. now is the database clock in unix ms.
func shadowStatements(prefix, now string) []string {
	return []string{
		"CREATE TEMP TABLE " + prefix + "lease AS SELECT * FROM " + prefix + "lease",
		"UPDATE " + prefix + "lease SET holder = 'ghost', instance = 'ghost', fencing_token = fencing_token + 100, " +
			"renewed_at = " + now + ", expires_at = " + now + " + 3600000",
		"CREATE TEMP TABLE " + prefix + "lanes AS SELECT * FROM " + prefix + "lanes",
		"INSERT INTO " + prefix + "lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) " +
			"VALUES ('leader', 'k', 'ghost', 'ghost', 100, " + now + ", " + now + ", " + now + " + 3600000)",
		"CREATE TEMP TABLE " + prefix + "config AS SELECT * FROM " + prefix + "config",
		"INSERT INTO " + prefix + "config (scope, config_version, updated_at) VALUES ('leader', 1000, 0)",
		"CREATE TEMP TABLE " + prefix + "nodes AS SELECT * FROM " + prefix + "nodes WHERE 1 = 0",
		"CREATE TEMP TABLE " + prefix + "high_water AS SELECT * FROM " + prefix + "high_water WHERE 1 = 0",
	}
}

// dbNow is the database clock in unix ms on d, as the package reads it.
func dbNow(d cluster.Dialect) string {
	if d == cluster.SQLite {
		return "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
	}
	return "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
}

// A temporary table of the same name as a cluster table changes nothing:
// every statement reaches the real tables whatever the session holds. An
// application that shares a node's one-connection pool snapshots the
// tables into temporary tables (and edits the copies); the node still
// renews the real lease, so no other node takes it, reads the real leader,
// fences against the real row, claims lanes and reads and bumps the config
// version in the real tables. Before, its renews went to the copy, the
// real lease expired, and two nodes led and passed Fence at once.
// (MySQL looks temporary tables up first even in a qualified name: the
// README's caveat.)
func TestTemporaryTablesDoNotShadow(t *testing.T) {
	t.Parallel()
	for _, d := range []cluster.Dialect{cluster.SQLite, cluster.Postgres} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			tg := testdb.New(t, d)
			dbA := tg.Open(t)
			dbA.SetMaxOpenConns(1) // the application and the node share one session
			a := startOn(t, tg, dbA, "a")
			leaderOf(t, 5*time.Second, a)
			claimAndBump(t, a) // the lanes and config rows exist before the copies
			for _, q := range shadowStatements(tg.Prefix, dbNow(d)) {
				if _, err := dbA.ExecContext(context.Background(), q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			b := start(t, tg, "b")
			checkUnshadowed(t, a, b)
		})
	}
}

// Through PgBouncer in transaction mode a temporary table stays on the
// server connection of the client that made it, where the next client's
// transactions run: another client's copies of the cluster tables, left on
// every server connection, change nothing for the nodes.
func TestPgBouncerTemporaryTablesDoNotShadow(t *testing.T) {
	tg := testdb.PgBouncer(t)
	ctx := context.Background()
	if p, err := cluster.NewDBProvider(tg.Open(t), cluster.Postgres, tg.Prefix); err != nil {
		t.Fatal(err)
	} else if err := p.Init(ctx); err != nil {
		t.Fatal(err)
	}

	// Another client makes the copies on as many server connections as
	// PgBouncer gives it at once (each transaction holds one until it
	// ends), then ends its transactions: the copies stay there, and the
	// nodes started after run on those server connections.
	other := tg.Open(t)
	const sessions = 20 // the CI PgBouncer's default_pool_size
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	made := make(chan struct{}, sessions)
	done := make(chan struct{})
	for range sessions {
		wg.Go(func() {
			err := func() error {
				tx, err := other.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				for _, q := range shadowStatements(tg.Prefix, dbNow(cluster.Postgres)) {
					if _, err := tx.ExecContext(ctx, q); err != nil {
						return err
					}
				}
				made <- struct{}{}
				<-done // hold this server connection until all are made
				return tx.Commit()
			}()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				made <- struct{}{}
			}
		})
	}
	for range sessions {
		<-made
	}
	close(done)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("another client's copies: %v", err)
	}
	other.Close()
	a := start(t, tg, "a")
	leaderOf(t, 5*time.Second, a)
	claimAndBump(t, a)
	b := start(t, tg, "b")
	checkUnshadowed(t, a, b)
}

// claimAndBump makes lane "k" and the config row exist, and frees the lane.
func claimAndBump(t *testing.T, a *node) {
	t.Helper()
	ctx := context.Background()
	if _, err := claimLane(ctx, a, "k"); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseLane(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.BumpConfigVersion(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkUnshadowed checks that a, whose database sessions hold copies of
// the cluster tables (shadowStatements), still works on the real ones,
// with b beside it on sessions that hold none.
func checkUnshadowed(t *testing.T, a, b *node) {
	t.Helper()
	ctx := context.Background()
	watchSingleLeader(t, a, b)
	token := a.FencingToken()
	// Long enough for a lease renewed only in the copies to expire and b
	// to take it.
	time.Sleep(3 * testdb.LeaseTTL)
	if !a.IsLeader() || b.IsLeader() || a.FencingToken() != token {
		t.Fatalf("after the copies: a leads %v (token %d, was %d), b leads %v", a.IsLeader(), a.FencingToken(), token, b.IsLeader())
	}
	for _, n := range []*node{a, b} {
		l, err := n.CurrentLeader(ctx)
		if err != nil || l.NodeID != "a" || l.FencingToken != token {
			t.Fatalf("%s reads the leader %+v, %v; want a with token %d", n.NodeID(), l, err, token)
		}
	}

	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Fence(ctx, tx)
	tx.Rollback()
	if err != nil || got != token {
		t.Fatalf("a's Fence = %d, %v; want token %d", got, err, token)
	}

	lane, err := claimLane(ctx, a, "k")
	if err != nil || lane != 2 {
		t.Fatalf("a's claim of lane k = %d, %v; want token 2 (the copy says a ghost holds it with 100)", lane, err)
	}
	if owner, err := b.LaneOwner(ctx, "k"); err != nil || owner == nil || owner.Holder != "a" || owner.FencingToken != 2 {
		t.Fatalf("b reads lane k's owner %+v, %v; want a with token 2", owner, err)
	}

	if v, err := a.ConfigVersion(ctx); err != nil || v != 1 {
		t.Fatalf("a reads config version %d, %v; want 1 (the copy says 1000)", v, err)
	}
	if v, err := a.BumpConfigVersion(ctx); err != nil || v != 2 {
		t.Fatalf("a bumps the config version to %d, %v; want 2", v, err)
	}
	if v, err := b.ConfigVersion(ctx); err != nil || v != 2 {
		t.Fatalf("b reads config version %d, %v; want 2", v, err)
	}
}
