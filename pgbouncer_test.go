package cluster_test

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

// The tests in this file run database/sql on pgx's stdlib driver through
// PgBouncer in transaction mode (CLUSTER_TEST_PGBOUNCER_DSN), with
// default_query_exec_mode=exec (testdb.PgBouncerSettings). Every
// transaction may land on another server connection: each lease statement
// is one statement, a fenced transaction keeps its server connection
// until it ends, and Fence's settings are transaction-local.

func TestPgBouncerConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, func(t *testing.T) func() provider.Provider {
		tg := testdb.PgBouncer(t)
		return func() provider.Provider { return initProvider(t, tg, tg.Open(t)) }
	})
}

// Nodes booting at once through PgBouncer all create or find the schema:
// its DDL runs in one transaction under pg_advisory_xact_lock, which ends
// with the transaction. A session lock would stay on whichever server
// connection took it, held by no client.
func TestPgBouncerSchema(t *testing.T) {
	t.Parallel()
	tg := testdb.PgBouncer(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		db := tg.Open(t)
		wg.Go(func() {
			p, err := cluster.NewDBProvider(db, "", tg.Prefix)
			if err == nil {
				err = p.Init(ctx)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Init through PgBouncer: %v", err)
	}
	db := tg.Open(t)
	var version int64
	if err := db.QueryRowContext(ctx, "SELECT MAX(version) FROM "+tg.Prefix+"schema_version").Scan(&version); err != nil || version != cluster.SchemaVersion {
		t.Fatalf("schema version %d (%v), want %d", version, err, cluster.SchemaVersion)
	}
	// pg_advisory_xact_lock takes a 64-bit key: classid holds its high
	// half, objid its low half.
	var held int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
		AND ((classid::bigint << 32) | objid::bigint) = hashtext($1)::bigint`,
		"sqlfence/cluster schema "+tg.Prefix).Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d schema locks left held after Init (%v), want none", held, err)
	}
	start(t, tg, "a") // finds the schema current
}

// Three nodes elect one leader, every node reads the same leader, and the
// leader hands off to another node when it shuts down.
func TestPgBouncerElection(t *testing.T) {
	t.Parallel()
	tg := testdb.PgBouncer(t)
	ctx := context.Background()
	// A long TTL: the handoff must come from the release, not expiry.
	nodes := []*node{start(t, tg, "a", longLease), start(t, tg, "b", longLease), start(t, tg, "c", longLease)}
	watchSingleLeader(t, nodes...)
	leader := leaderOf(t, 3*time.Second, nodes...)
	token := leader.FencingToken()
	for _, n := range nodes {
		l, err := n.CurrentLeader(ctx)
		if err != nil || l == nil || l.NodeID != leader.NodeID() || l.FencingToken != token {
			t.Fatalf("%s: CurrentLeader = %+v, %v; want %s with token %d", n.NodeID(), l, err, leader.NodeID(), token)
		}
	}
	if err := leader.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if e := leader.events.wait(t, cluster.EventLeaseReleased, time.Second); e.Reason != cluster.ReasonShutdown || e.FencingToken != token {
		t.Fatalf("released event = %+v, want shutdown of token %d", e, token)
	}
	var rest []*node
	for _, n := range nodes {
		if n != leader {
			rest = append(rest, n)
		}
	}
	next := leaderOf(t, 3*time.Second, rest...)
	if next.FencingToken() <= token {
		t.Fatalf("token after the handoff = %d, want above %d", next.FencingToken(), token)
	}
}

// A leader that loses its database stops believing it leads, and another
// node takes over once its lease expires.
func TestPgBouncerTakeoverAfterCrash(t *testing.T) {
	t.Parallel()
	tg := testdb.PgBouncer(t)
	a := start(t, tg, "a")
	b := start(t, tg, "b")
	watchSingleLeader(t, a, b)
	old := a.FencingToken()
	if old == 0 {
		t.Fatal("first node does not lead after New")
	}
	a.db.Close() // the crash: no release
	if lost := a.events.wait(t, cluster.EventLeaseLost, 3*time.Second); lost.Reason != cluster.ReasonSelfFenced || lost.FencingToken != old {
		t.Fatalf("lost event = %+v, want self-fenced with token %d", lost, old)
	}
	if e := b.events.wait(t, cluster.EventLeaseAcquired, 5*time.Second); e.FencingToken <= old {
		t.Fatalf("token after the takeover = %d, want above %d", e.FencingToken, old)
	}
}

// Fenced writes and chain tips commit for the leader, and the database
// refuses both from a stale leader that still believes it leads.
func TestPgBouncerFence(t *testing.T) {
	t.Parallel()
	tg := testdb.PgBouncer(t)
	ctx := context.Background()
	setup := tg.Open(t)
	createWriteLog(t, tg, setup)
	table := createAuditTable(t, tg, setup)
	// a renews rarely, so it keeps believing it leads after the takeover.
	a := start(t, tg, "a", slowRenew, withAudit(table))
	if err := fencedWrite(ctx, a.db, a.Fence, tg.Dialect, tg.Prefix, "a"); err != nil {
		t.Fatalf("fenced write by the leader: %v", err)
	}
	appendAudit(t, tg, a, table, 1, 2)

	expireLease(t, tg, setup)
	b := start(t, tg, "b", withAudit(table))
	if !b.IsLeader() || !a.IsLeader() {
		t.Fatalf("setup: want both to believe they lead; a %v, b %v", a.IsLeader(), b.IsLeader())
	}
	if err := fencedWrite(ctx, a.db, a.Fence, tg.Dialect, tg.Prefix, "a"); !errors.Is(err, cluster.ErrStaleFencingToken) {
		t.Fatalf("fenced write by the stale leader = %v, want ErrStaleFencingToken", err)
	}
	// Without Fence, the chain-tip trigger refuses it on its own.
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = a.AdvanceTip(ctx, tx, "audit", 3, hashOf(3, "a"))
	tx.Rollback()
	if !errors.Is(err, cluster.ErrStaleFencingToken) {
		t.Fatalf("AdvanceTip by the stale leader = %v, want ErrStaleFencingToken", err)
	}
	if err := fencedWrite(ctx, b.db, b.Fence, tg.Dialect, tg.Prefix, "b"); err != nil {
		t.Fatalf("fenced write by the new leader: %v", err)
	}
	appendAudit(t, tg, b, table, 3, 4)
	if w := readWriteLog(t, tg, setup); len(w) != 2 || w[0].node != "a" || w[1].node != "b" {
		t.Fatalf("write log %+v, want a's write then b's", w)
	}
}

// Fenced writers on two nodes run through a forced takeover: every stale
// write is refused, and committed tokens never decrease in commit order.
func TestPgBouncerFencedWritersAcrossTakeover(t *testing.T) {
	t.Parallel()
	tg := testdb.PgBouncer(t)
	setup := tg.Open(t)
	createWriteLog(t, tg, setup)
	a := start(t, tg, "a", func(c *cluster.Config) {
		c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 4*time.Second, 1500*time.Millisecond, 3*time.Second
	})
	b := start(t, tg, "b")
	var refused, committed atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, n := range []*node{a, a, b, b} {
		wg.Go(func() {
			for !stop.Load() {
				if !n.IsLeader() {
					time.Sleep(time.Millisecond)
					continue
				}
				err := fencedWrite(context.Background(), n.db, n.Fence, tg.Dialect, tg.Prefix, n.NodeID())
				time.Sleep(time.Millisecond) // leave the lease row a chance
				switch {
				case err == nil:
					committed.Add(1)
				case errors.Is(err, cluster.ErrStaleFencingToken):
					refused.Add(1)
				default:
					t.Errorf("fenced write by %s: %v", n.NodeID(), err)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	expireLease(t, tg, setup)
	b.events.wait(t, cluster.EventLeaseAcquired, 5*time.Second)
	a.events.wait(t, cluster.EventLeaseLost, 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	byNode := map[string]int{}
	for _, w := range readWriteLog(t, tg, setup) {
		byNode[w.node]++
	}
	t.Logf("%d committed (%v), %d stale writes refused", committed.Load(), byNode, refused.Load())
	if byNode["a"] == 0 || byNode["b"] == 0 || refused.Load() == 0 {
		t.Fatalf("want commits from both leaders and refused stale writes; got %v and %d refused", byNode, refused.Load())
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

// bouncerWorkload runs three nodes on tg for 2s, each fencing writes from
// two goroutines while it leads and reading the leader otherwise, and
// returns the first error: New's, a failed provider call's (acquire,
// renew, release, fence) or a fenced write's, or nil.
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
	setup := tg.Open(t)
	if _, err := setup.ExecContext(ctx, "CREATE TABLE "+tg.Prefix+"seq (id INTEGER PRIMARY KEY, n BIGINT NOT NULL)"); err != nil {
		return err
	}
	if _, err := setup.ExecContext(ctx, "CREATE TABLE "+tg.Prefix+"writes (seq BIGINT PRIMARY KEY, token BIGINT NOT NULL, node TEXT NOT NULL)"); err != nil {
		return err
	}
	if _, err := setup.ExecContext(ctx, "INSERT INTO "+tg.Prefix+"seq (id, n) VALUES (1, 0)"); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b", "c"} {
		db := tg.Open(t)
		cfg := tg.Config(t, db, id)
		cfg.Observer = func(op cluster.Operation) {
			// A follower's attempt may wait out its timeout behind the
			// leader's fenced transactions, which hold the lease row.
			waited := op.Kind == cluster.OpAcquire && errors.Is(op.Err, context.DeadlineExceeded)
			if op.Outcome == cluster.OutcomeError && !waited && ctx.Err() == nil {
				fail(op.Err)
			}
		}
		c, err := cluster.New(ctx, cfg)
		if err != nil {
			fail(err)
			break
		}
		t.Cleanup(func() { c.Shutdown(context.Background()) })
		for range 2 {
			wg.Go(func() {
				for ctx.Err() == nil {
					var err error
					if c.IsLeader() {
						err = fencedWrite(ctx, db, c.Fence, tg.Dialect, tg.Prefix, id)
					} else {
						_, err = c.CurrentLeader(ctx)
					}
					if err != nil && ctx.Err() == nil && !errors.Is(err, cluster.ErrStaleFencingToken) {
						fail(err)
					}
					time.Sleep(5 * time.Millisecond) // leave the lease row a chance
				}
			})
		}
	}
	wg.Wait()
	if first == nil && len(readWriteLog(t, tg, setup)) == 0 {
		return errors.New("no fenced write committed")
	}
	return first
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// The lane suite passes through PgBouncer: claims run in database/sql
// transactions, whose set_config calls are transaction-local.
func TestPgBouncerLaneConformance(t *testing.T) {
	t.Parallel()
	providertest.RunLanes(t, func(t *testing.T) providertest.LaneTarget {
		return sqlLaneTarget(t, testdb.PgBouncer(t))
	})
}

// Three nodes work on six lanes through PgBouncer, each writing only in
// transactions that begin with ClaimLane; one shuts down, releasing its
// lanes at once, and the others take them. Every lane's committed writes
// stay in token order, one node per token; no lane is owned by two nodes
// at once; the keepers' renewals and the config version go through too.
func TestPgBouncerLanes(t *testing.T) {
	t.Parallel()
	tg := testdb.PgBouncer(t)
	ctx := context.Background()
	setup := tg.Open(t)
	createLaneLog(t, tg, setup)
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	a, b, c := start(t, tg, "a"), start(t, tg, "b"), start(t, tg, "c")
	watchLaneOwners(t, keys, a, b, c)
	workers := map[*node]*laneWorker{}
	for _, n := range []*node{a, b, c} {
		workers[n] = startLaneWorker(t, tg, n, keys, 200*time.Millisecond)
	}
	waitFor(t, 10*time.Second, "every lane owned", func() bool {
		s := lanesOf(keys, a, b, c)
		return s[0]+s[1]+s[2] == len(keys)
	})
	waitFor(t, 10*time.Second, "a to own a lane", func() bool { return len(a.Lanes()) > 0 })
	for _, k := range keys {
		if _, err := b.LaneOwner(ctx, k); err != nil {
			t.Fatalf("LaneOwner(%s) through PgBouncer: %v", k, err)
		}
	}
	if v, err := b.BumpConfigVersion(ctx); err != nil || v != 1 {
		t.Fatalf("BumpConfigVersion = %d, %v", v, err)
	}
	c.ConfigVersionCached() // c watches from now on
	waitFor(t, 5*time.Second, "c to see version 1", func() bool { return c.ConfigVersionCached() == 1 })

	workers[a].halt()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// Every lane a began is accounted for: lost, released or handed over
	// while it ran, or released by its Shutdown.
	began, ended := 0, 0
	for _, e := range a.events.all() {
		switch e.Kind {
		case cluster.EventLaneAcquired:
			began++
		case cluster.EventLaneLost, cluster.EventLaneReleased:
			ended++
		}
	}
	if began == 0 || began != ended {
		t.Fatalf("a's lane events: %d claims began, %d ended; want every one ended", began, ended)
	}
	waitFor(t, 10*time.Second, "b and c to own every lane", func() bool {
		s := lanesOf(keys, b, c)
		return s[0]+s[1] == len(keys) && s[0] > 0 && s[1] > 0
	})
	// Give the new owners a round of writes each, then stop.
	written := func() int {
		n := 0
		for _, log := range readLaneLog(t, tg, setup) {
			n += len(log)
		}
		return n
	}
	before := written()
	waitFor(t, 10*time.Second, "writes after the takeover", func() bool { return written() >= before+len(keys) })
	for _, w := range workers {
		w.halt()
		if errs := w.unexpected(); len(errs) > 0 {
			t.Fatalf("worker errors through PgBouncer: %v", errs)
		}
	}
	for _, k := range keys {
		if l, err := b.LaneOwner(ctx, k); err != nil || l != nil && l.Holder == "a" {
			t.Fatalf("LaneOwner(%s) after a shut down = %+v, %v", k, l, err)
		}
	}
	logs := readLaneLog(t, tg, setup) // checks token order and one node per token
	for _, k := range keys {
		if len(logs[k]) == 0 {
			t.Errorf("lane %s has no writes", k)
		}
	}
}
