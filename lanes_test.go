package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// expectedLaneRefusal reports an error a lane worker expects: the lane is
// another node's, or the worker's node is gone.
func expectedLaneRefusal(err error) bool {
	return errors.Is(err, cluster.ErrLaneHeld) || errors.Is(err, cluster.ErrLaneLimit) ||
		errors.Is(err, cluster.ErrShutdown) || errors.Is(err, sql.ErrConnDone) ||
		strings.Contains(err.Error(), "database is closed")
}

// A claim leases a free lane to this node with a new token, renews it
// with the same token, and refuses a lane another node holds, saying who
// holds it; a released lane is claimed by another node at once, with the
// next token.
func TestClaimLane(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		b := start(t, tg, "b")

		token, err := claimLane(ctx, a, "orders-1")
		if err != nil || token != 1 {
			t.Fatalf("first claim = %d, %v; want token 1", token, err)
		}
		if again, err := claimLane(ctx, a, "orders-1"); err != nil || again != token {
			t.Fatalf("renewal by the owner = %d, %v; want the same token %d", again, err, token)
		}
		if !a.OwnsLane("orders-1") || b.OwnsLane("orders-1") || a.OwnsLane("orders-2") {
			t.Fatalf("OwnsLane: a %v, b %v, a of another lane %v", a.OwnsLane("orders-1"), b.OwnsLane("orders-1"), a.OwnsLane("orders-2"))
		}
		if got := a.Lanes(); !slices.Equal(got, []string{"orders-1"}) {
			t.Fatalf("a.Lanes() = %v", got)
		}

		_, err = claimLane(ctx, b, "orders-1")
		var held *cluster.LaneHeldError
		if !errors.Is(err, cluster.ErrLaneHeld) || !errors.As(err, &held) {
			t.Fatalf("claim of a held lane = %v, want ErrLaneHeld", err)
		}
		if held.Lane != "orders-1" || held.Holder != "a" || held.FencingToken != token || held.Remaining <= 0 || held.Remaining > time.Second || held.ExpiresAt.IsZero() {
			t.Fatalf("LaneHeldError = %+v", held)
		}

		if err := a.ReleaseLane(ctx, "orders-1"); err != nil {
			t.Fatal(err)
		}
		if a.OwnsLane("orders-1") {
			t.Fatal("a owns the lane it released")
		}
		if got, err := claimLane(ctx, b, "orders-1"); err != nil || got != token+1 {
			t.Fatalf("claim after the release = %d, %v; want token %d", got, err, token+1)
		}
		if _, err := claimLane(ctx, a, "orders-1"); !errors.Is(err, cluster.ErrLaneHeld) {
			t.Fatalf("claim by the former owner = %v, want ErrLaneHeld", err)
		}

		// Lanes are per lease name: another cluster in the same tables has
		// its own.
		other := start(t, tg, "x", func(c *cluster.Config) { c.LeaseName = "other" })
		if got, err := claimLane(ctx, other, "orders-1"); err != nil || got != 1 {
			t.Fatalf("claim of the same key under another lease name = %d, %v; want token 1", got, err)
		}

		for _, bad := range []string{"", " x", "x ", "a\nb", strings.Repeat("k", 129)} {
			if _, err := claimLane(ctx, a, bad); !errors.Is(err, cluster.ErrInvalidConfig) {
				t.Errorf("claim of lane %q = %v, want ErrInvalidConfig", bad, err)
			}
		}
	})
}

// LaneOwner reads who holds a lane now, for any node: nil for a lane never
// claimed or released, the holder with its token and time left otherwise.
// The operator's calls list every lane and end a claim whoever holds it,
// keeping its token.
func TestLaneOwner(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		b := start(t, tg, "b")
		if l, err := b.LaneOwner(ctx, "orders-1"); l != nil || err != nil {
			t.Fatalf("LaneOwner of a lane never claimed = %+v, %v; want nil, nil", l, err)
		}
		token, err := claimLane(ctx, a, "orders-1")
		if err != nil {
			t.Fatal(err)
		}
		l, err := b.LaneOwner(ctx, "orders-1")
		if err != nil || l == nil {
			t.Fatalf("LaneOwner of a's lane = %+v, %v", l, err)
		}
		if l.Key != "orders-1" || l.Holder != "a" || l.Instance == "" || l.FencingToken != token ||
			l.Remaining <= 0 || l.Remaining > testdb.LeaseTTL || !l.ExpiresAt.After(l.AcquiredAt) {
			t.Fatalf("LaneOwner = %+v; want a with token %d and at most %v left", l, token, testdb.LeaseTTL)
		}
		if _, err := b.LaneOwner(ctx, " x"); !errors.Is(err, cluster.ErrInvalidConfig) {
			t.Fatalf("LaneOwner of a bad key = %v, want ErrInvalidConfig", err)
		}

		p, err := cluster.NewDBProvider(tg.Open(t), tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := claimLane(ctx, b, "orders-2"); err != nil {
			t.Fatal(err)
		}
		all, err := p.ListLanes(ctx, "leader")
		if err != nil || len(all) != 2 || all[0].Key != "orders-1" || all[0].Holder != "a" || all[1].Key != "orders-2" ||
			all[1].Holder != "b" || all[1].Remaining <= 0 {
			t.Fatalf("ListLanes = %+v, %v; want orders-1 held by a, orders-2 by b", all, err)
		}
		if other, err := p.ListLanes(ctx, "other"); len(other) != 0 || err != nil {
			t.Fatalf("ListLanes of another lease name = %+v, %v", other, err)
		}

		// Forced release: it names the claim it ends by its token, and ends
		// no other; the lane is then free at once, with its token kept, so
		// the next claim, by anyone, gets the next token.
		var held *cluster.LaneHeldError
		if released, err := p.ForceReleaseLane(ctx, "leader", "orders-1", token-1); released || !errors.As(err, &held) ||
			held.Holder != "a" || held.FencingToken != token || held.Lane != "orders-1" {
			t.Fatalf("ForceReleaseLane of another token = %v, %v; want false and a LaneHeldError naming a with token %d", released, err, token)
		}
		if released, err := p.ForceReleaseLane(ctx, "leader", "orders-1", token); !released || err != nil {
			t.Fatalf("ForceReleaseLane = %v, %v; want true", released, err)
		}
		if released, err := p.ForceReleaseLane(ctx, "leader", "orders-1", token); released || err != nil {
			t.Fatalf("ForceReleaseLane of a free lane = %v, %v; want false, nil", released, err)
		}
		if l, err := a.LaneOwner(ctx, "orders-1"); l != nil || err != nil {
			t.Fatalf("LaneOwner after a forced release = %+v, %v; want nil", l, err)
		}
		// Its holder's next claim starts a new claim, under a new token.
		if got, err := claimLane(ctx, a, "orders-1"); err != nil || got != token+1 {
			t.Fatalf("claim after a forced release = %d, %v; want token %d", got, err, token+1)
		}
		if l, err := b.LaneOwner(ctx, "orders-1"); err != nil || l == nil || l.Holder != "a" || l.FencingToken != token+1 {
			t.Fatalf("LaneOwner after the new claim = %+v, %v", l, err)
		}

		// A released lane has no owner; a node shut down answers no more.
		if err := b.ReleaseLane(ctx, "orders-2"); err != nil {
			t.Fatal(err)
		}
		if l, err := a.LaneOwner(ctx, "orders-2"); l != nil || err != nil {
			t.Fatalf("LaneOwner of a released lane = %+v, %v; want nil", l, err)
		}
		if err := a.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := a.LaneOwner(ctx, "orders-1"); !errors.Is(err, cluster.ErrShutdown) {
			t.Fatalf("LaneOwner after Shutdown = %v, want ErrShutdown", err)
		}
	})
}

// laneMark is the high-water scope of a lane of the default lease name.
func laneMark(key string) string { return "lane/6/leader/" + key }

// Raw SQL that would lower, reuse or erase a lane's token, or lower or
// erase the config version, is refused by the database with a guard per
// rule, mapped to its sentinel, on every dialect; TRUNCATE, which MySQL
// cannot trap, makes the next claim of a truncated lane fail instead of
// granting a token again.
func TestLaneGuards(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		a := startOn(t, tg, db, "a")
		if _, err := claimLane(ctx, a, "k"); err != nil {
			t.Fatal(err)
		}
		if err := a.ReleaseLane(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		token, err := claimLane(ctx, a, "k") // token 2
		if err != nil || token != 2 {
			t.Fatalf("second claim = %d, %v", token, err)
		}
		if _, err := a.BumpConfigVersion(ctx); err != nil {
			t.Fatal(err)
		}
		lanes, marks, config := tg.Prefix+"lanes", tg.Prefix+"high_water", tg.Prefix+"config"
		var mark int64
		if err := db.QueryRowContext(ctx, bind(tg.Dialect, "SELECT value FROM "+marks+" WHERE scope = ?"), laneMark("k")).Scan(&mark); err != nil || mark != 2 {
			t.Fatalf("the lane's high-water mark = %d (%v), want 2", mark, err)
		}

		refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "UPDATE "+lanes+" SET fencing_token = 1")
		refusedWith(t, tg, db, "SF008", cluster.ErrLaneDeleted, "UPDATE "+lanes+" SET lane = 'other'")
		refusedWith(t, tg, db, "SF008", cluster.ErrLaneDeleted, "UPDATE "+lanes+" SET scope = 'other'")
		refusedWith(t, tg, db, "SF008", cluster.ErrLaneDeleted, "DELETE FROM "+lanes)
		refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "UPDATE "+config+" SET config_version = 0")
		refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "DELETE FROM "+config)
		// A lane row below its high-water mark: a restored or re-created row.
		if _, err := db.ExecContext(ctx, bind(tg.Dialect, "INSERT INTO "+marks+" (scope, value) VALUES (?, 9)"), laneMark("restored")); err != nil {
			t.Fatal(err)
		}
		refusedWith(t, tg, db, "SF007", cluster.ErrRollbackDetected,
			"INSERT INTO "+lanes+" (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) VALUES ('leader', 'restored', 'x', 'y', 3, 0, 0, 0)")
		switch tg.Dialect {
		case cluster.Postgres:
			refusedWith(t, tg, db, "SF008", cluster.ErrLaneDeleted, "TRUNCATE "+lanes)
			refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "TRUNCATE "+config)
		case cluster.SQLite:
			refusedWith(t, tg, db, "SF007", cluster.ErrRollbackDetected,
				"INSERT OR REPLACE INTO "+lanes+" (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) VALUES ('leader', 'k', 'x', 'y', 1, 0, 0, 0)")
			refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "REPLACE INTO "+config+" (scope, config_version, updated_at) VALUES ('leader', 0, 0)")
		case cluster.MySQL:
			refusedWith(t, tg, db, "SF008", cluster.ErrLaneDeleted,
				"REPLACE INTO "+lanes+" (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) VALUES ('leader', 'k', 'x', 'y', 5, 0, 0, 0)")
			refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "REPLACE INTO "+config+" (scope, config_version, updated_at) VALUES ('leader', 0, 0)")
		}

		// Nothing above changed the lane: a stale claim is still refused and
		// the next claim gets the next token.
		b := start(t, tg, "b")
		if _, err := claimLane(ctx, b, "k"); !errors.Is(err, cluster.ErrLaneHeld) {
			t.Fatalf("claim of a's lane = %v, want ErrLaneHeld", err)
		}
		a.Shutdown(ctx)
		if got, err := claimLane(ctx, b, "k"); err != nil || got != 3 {
			t.Fatalf("claim after a shut down = %d, %v; want token 3", got, err)
		}
		if v, err := b.ConfigVersion(ctx); err != nil || v != 1 {
			t.Fatalf("config version after the refused statements = %d, %v; want 1", v, err)
		}
		b.Shutdown(ctx)

		if tg.Dialect != cluster.MySQL {
			return
		}
		// MySQL cannot trap TRUNCATE: the next claim of a truncated lane
		// starts again at 1, below its mark, and is refused.
		if _, err := db.ExecContext(ctx, "TRUNCATE "+lanes); err != nil {
			t.Fatal(err)
		}
		c := start(t, tg, "c")
		if _, err := claimLane(ctx, c, "k"); !errors.Is(err, cluster.ErrRollbackDetected) {
			t.Fatalf("claim after TRUNCATE = %v, want ErrRollbackDetected", err)
		}
		// The documented repair: put the lane's row back at its mark (two
		// statements: a trigger cannot write the table its statement reads).
		if err := db.QueryRowContext(ctx, "SELECT value FROM "+marks+" WHERE scope = ?", laneMark("k")).Scan(&mark); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO "+lanes+" (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) "+
			"VALUES ('leader', 'k', '', '', ?, 0, 0, 0)", mark); err != nil {
			t.Fatalf("repair: %v", err)
		}
		if got, err := claimLane(ctx, c, "k"); err != nil || got != 4 {
			t.Fatalf("claim after the repair = %d, %v; want token 4", got, err)
		}
	})
}

// A lane owner paused past its lanes' TTL and its membership's (stood in
// for by expiring its lanes in the database and taking it out of the
// lanes' census, while its heartbeat is slow enough that it still believes
// it owns them) is
// refused in its next transaction once another node claimed the lane;
// every lane's committed writes stay in token order, one node per token.
func TestLaneFencedWritersAcrossTakeover(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		setup := tg.Open(t)
		createLaneLog(t, tg, setup)
		keys := []string{"k0", "k1", "k2", "k3"}
		a := start(t, tg, "a", func(c *cluster.Config) {
			c.LeaseTTL = 20 * time.Second
			c.HeartbeatInterval = 6 * time.Second
			c.FenceTimeout = 14 * time.Second
		})
		for _, k := range keys {
			if _, err := laneWrite(ctx, a, tg.Dialect, tg.Prefix, k); err != nil {
				t.Fatal(err)
			}
		}
		b := start(t, tg, "b")
		// a drops out of the lanes' census, as when its membership lapses.
		if _, err := setup.ExecContext(ctx, bind(tg.Dialect, "UPDATE "+tg.Prefix+"nodes SET takes_lanes = 0 WHERE node_id = ?"), "a"); err != nil {
			t.Fatal(err)
		}

		var staleRefused atomic.Int64
		var pauseA, parkedA, stop atomic.Bool
		var roundsA atomic.Int64
		var wg sync.WaitGroup
		for _, n := range []*node{a, b} {
			wg.Go(func() {
				for !stop.Load() {
					if n == a && pauseA.Load() {
						parkedA.Store(true)
						time.Sleep(time.Millisecond)
						continue
					}
					for _, k := range keys {
						owned := n.OwnsLane(k)
						_, err := laneWrite(ctx, n, tg.Dialect, tg.Prefix, k)
						if errors.Is(err, cluster.ErrLaneHeld) && owned {
							staleRefused.Add(1)
						}
					}
					if n == a {
						roundsA.Add(1)
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		// a is "paused" past its lanes' TTL: b takes every lane while a,
		// whose heartbeat is slow, still believes it owns them; a resumes.
		// a's keeper may correct a's belief in between: then try again.
		for attempt := 0; staleRefused.Load() == 0; attempt++ {
			if attempt == 10 {
				t.Fatal("a's keeper corrected its belief before every resumption")
			}
			parkedA.Store(false)
			pauseA.Store(true)
			waitFor(t, 5*time.Second, "a's workers to pause", parkedA.Load)
			if _, err := setup.ExecContext(ctx, bind(tg.Dialect, "UPDATE "+tg.Prefix+"lanes SET expires_at = 0 WHERE holder = ?"), "a"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "b to take every lane", func() bool {
				return slices.Equal(lanesOf(keys, b), []int{len(keys)})
			})
			rounds := roundsA.Load()
			pauseA.Store(false)
			waitFor(t, 5*time.Second, "a to resume", func() bool { return roundsA.Load() > rounds })
		}
		stop.Store(true)
		wg.Wait()

		byNode := map[string]int{}
		for _, log := range readLaneLog(t, tg, setup) {
			for _, e := range log {
				byNode[e.node]++
			}
		}
		t.Logf("committed %v; %d claims of lanes a believed it owned refused by the database", byNode, staleRefused.Load())
	})
}

// The lanes of a node that died (its pool closed before Shutdown, so it
// neither renews nor releases) are claimed by another node once they
// expire by the database clock, not before; OwnsLane never shows one lane
// owned by two nodes.
func TestLanesOfCrashedNodeClaimedAfterTTL(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		keys := []string{"k1", "k2"}
		a := start(t, tg, "a")
		b := start(t, tg, "b")
		watchLaneOwners(t, append(keys, "k0"), a, b)
		// b takes a lane of its own first, so that a's two stay within a's
		// fair share (⌈3 lanes / 2 members⌉) and a keeps them.
		if _, err := claimLane(ctx, b, "k0"); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if _, err := claimLane(ctx, a, k); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := claimLane(ctx, b, "k1"); !errors.Is(err, cluster.ErrLaneHeld) {
			t.Fatalf("claim of a live node's lane = %v, want ErrLaneHeld", err)
		}
		if !a.OwnsLane("k1") || !a.OwnsLane("k2") {
			t.Fatalf("a owns k1 %v, k2 %v before the crash", a.OwnsLane("k1"), a.OwnsLane("k2"))
		}
		crash := time.Now()
		a.db.Close()
		// When a's lanes expire, by the database clock: a renews no more.
		expires := map[string]int64{}
		for _, k := range keys {
			var e int64
			if err := b.db.QueryRowContext(ctx, bind(tg.Dialect, "SELECT expires_at FROM "+tg.Prefix+"lanes WHERE lane = ?"), k).Scan(&e); err != nil {
				t.Fatal(err)
			}
			expires[k] = e
		}

		claimed := map[string]time.Duration{}
		waitFor(t, 10*time.Second, "b to claim a's lanes", func() bool {
			for _, k := range keys {
				if _, ok := claimed[k]; ok {
					continue
				}
				if token, err := claimLane(ctx, b, k); err == nil {
					if token != 2 {
						t.Fatalf("b claimed %s with token %d, want 2", k, token)
					}
					claimed[k] = time.Since(crash)
				} else if !expectedLaneRefusal(err) {
					t.Fatalf("claim of %s: %v", k, err)
				}
			}
			time.Sleep(10 * time.Millisecond)
			return len(claimed) == len(keys)
		})
		t.Logf("a's lanes claimed by b after %v (LeaseTTL 1s, heartbeat 100ms; the second waits for a to drop out of the fair share, a heartbeat later)", claimed)
		for _, k := range keys {
			var acquired int64
			if err := b.db.QueryRowContext(ctx, bind(tg.Dialect, "SELECT acquired_at FROM "+tg.Prefix+"lanes WHERE lane = ?"), k).Scan(&acquired); err != nil {
				t.Fatal(err)
			}
			if acquired < expires[k] {
				t.Errorf("lane %s claimed at %d, before a's claim expired at %d (database clock)", k, acquired, expires[k])
			}
		}
		if a.OwnsLane("k1") || a.OwnsLane("k2") {
			t.Error("a still believes it owns its lanes")
		}
	})
}

// Shutdown releases a node's lanes at once: another node claims them
// without waiting for them to expire, and the node claims nothing more.
func TestLanesReleasedOnShutdown(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		keys := []string{"k1", "k2", "k3"}
		a := start(t, tg, "a")
		b := start(t, tg, "b")
		for _, k := range keys {
			if _, err := claimLane(ctx, a, k); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		for _, k := range keys {
			if a.OwnsLane(k) {
				t.Errorf("a owns %s after Shutdown", k)
			}
			if token, err := claimLane(ctx, b, k); err != nil || token != 2 {
				t.Fatalf("claim of %s right after a shut down = %d, %v; want token 2", k, token, err)
			}
		}
		t.Logf("b claimed a's %d lanes %v after a's Shutdown returned", len(keys), time.Since(begin).Round(time.Millisecond))
		if _, err := claimLane(ctx, a, "k4"); !errors.Is(err, cluster.ErrShutdown) || !errors.Is(err, cluster.ErrStaleFencingToken) {
			t.Fatalf("claim after Shutdown = %v, want ErrShutdown and ErrStaleFencingToken", err)
		}
		if a.Lanes() != nil {
			t.Fatalf("a.Lanes() after Shutdown = %v", a.Lanes())
		}
	})
}

// waitBalanced waits until the nodes own exactly want lanes each, and
// every key is owned, and returns how long it took.
func waitBalanced(t *testing.T, keys []string, want []int, nodes ...*node) time.Duration {
	t.Helper()
	return waitFor(t, 15*time.Second, "lanes balanced as "+fmtInts(want), func() bool {
		return slices.Equal(lanesOf(keys, nodes...), want)
	})
}

func fmtInts(v []int) string {
	var b strings.Builder
	for i, n := range v {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(string(rune('0' + n)))
	}
	return b.String()
}

// One fast node does not keep every lane when others join: each node
// claims only up to its fair share (⌈lanes / members⌉), hands over the
// lanes above it at its next heartbeat, and the lanes of a node that
// leaves are taken up by the rest. The bound on each convergence is
// generous; the times are logged.
func TestLaneBalance(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		setup := tg.Open(t)
		createLaneLog(t, tg, setup)
		keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
		a := start(t, tg, "a")
		wa := startLaneWorker(t, tg, a, keys, 100*time.Millisecond)
		waitBalanced(t, keys, []int{6}, a)

		b := start(t, tg, "b")
		wb := startLaneWorker(t, tg, b, keys, 100*time.Millisecond)
		joined := waitBalanced(t, keys, []int{3, 3}, a, b)

		c := start(t, tg, "c")
		wc := startLaneWorker(t, tg, c, keys, 100*time.Millisecond)
		joined3 := waitBalanced(t, keys, []int{2, 2, 2}, a, b, c)

		wb.halt()
		if err := b.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		left := waitBalanced(t, keys, []int{3, 3}, a, c)
		t.Logf("balanced %v after b joined, %v after c joined, %v after b left (LeaseTTL 1s, heartbeat 100ms)",
			joined.Round(time.Millisecond), joined3.Round(time.Millisecond), left.Round(time.Millisecond))
		for _, w := range []*laneWorker{wa, wb, wc} {
			w.halt()
			if errs := w.unexpected(); len(errs) > 0 {
				t.Errorf("a worker failed: %v", errs)
			}
		}
		readLaneLog(t, tg, setup) // tokens in order on every lane
	})
}

// Config.MaxLanes caps a node's lanes: a claim beyond it is refused with
// ErrLaneLimit, and a lone node still takes every lane otherwise.
func TestMaxLanes(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a", func(c *cluster.Config) { c.MaxLanes = 2 })
		for _, k := range []string{"k0", "k1"} {
			if _, err := claimLane(ctx, a, k); err != nil {
				t.Fatal(err)
			}
		}
		_, err := claimLane(ctx, a, "k2")
		if !errors.Is(err, cluster.ErrLaneLimit) || !strings.Contains(err.Error(), "MaxLanes") {
			t.Fatalf("a third lane past MaxLanes 2 = %v, want ErrLaneLimit naming MaxLanes", err)
		}
		if _, err := claimLane(ctx, a, "k0"); err != nil {
			t.Fatalf("renewing a lane at the cap: %v", err)
		}
		b := start(t, tg, "b")
		for _, k := range []string{"k2", "k3", "k4"} {
			if _, err := claimLane(ctx, b, k); err != nil {
				t.Fatalf("a lone uncapped node's claim of %s: %v", k, err)
			}
		}
		if _, err := cluster.ResolveConfig(cluster.Config{NodeID: "x", DB: tg.Open(t), MaxLanes: -1}); !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), "MaxLanes (-1)") {
			t.Fatalf("MaxLanes -1 = %v, want ErrInvalidConfig naming it", err)
		}
	})
}

// OwnsLane reads an immutable snapshot: no lock, no I/O, no allocation.
func TestOwnsLaneDoesNotAllocate(t *testing.T) {
	tg := testdb.New(t, cluster.SQLite)
	a := start(t, tg, "a")
	for _, k := range []string{"k0", "k1", "k2"} {
		if _, err := claimLane(context.Background(), a, k); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(1000, func() {
		if !a.OwnsLane("k1") || a.OwnsLane("k9") {
			t.Fatal("OwnsLane is wrong")
		}
	}); n != 0 {
		t.Fatalf("OwnsLane allocates %v times per call", n)
	}
}

// joinFailsOnce is the default provider whose first membership join fails,
// as under write contention at start.
type joinFailsOnce struct {
	*cluster.DBProvider
	failed atomic.Bool
}

func (p *joinFailsOnce) Join(ctx context.Context, scope string, m cluster.Member) error {
	if !p.failed.Swap(true) {
		return errors.New("join the cluster: context deadline exceeded")
	}
	return p.DBProvider.Join(ctx, scope, m)
}

// A node whose membership could not be recorded at start still gets its
// share of the lanes: its keeper records the membership again, and the
// node that held every lane hands one over.
func TestLaneShareAfterFailedJoin(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		keys := []string{"k1", "k2"}
		a := start(t, tg, "a")
		for _, k := range keys {
			if _, err := claimLane(ctx, a, k); err != nil {
				t.Fatal(err)
			}
		}
		db := tg.Open(t)
		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		b := startOn(t, tg, db, "b", func(c *cluster.Config) { c.Provider = &joinFailsOnce{DBProvider: p} })
		waitFor(t, 10*time.Second, "b to get a lane", func() bool {
			for _, k := range keys {
				if _, err := claimLane(ctx, b, k); err != nil && !expectedLaneRefusal(err) {
					t.Fatalf("claim of %s: %v", k, err)
				}
			}
			time.Sleep(20 * time.Millisecond)
			return slices.Equal(lanesOf(keys, a, b), []int{1, 1})
		})
		ms, err := b.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var listed bool
		for _, m := range ms {
			listed = listed || m.NodeID == "b"
		}
		if !listed {
			t.Fatalf("b is not a member after its keeper joined again: %+v", ms)
		}
	})
}

// Slow membership refreshes do not cost a node its lanes: where the lease
// statements do not refresh membership (MySQL, SQLite) the keeper
// refreshes it before each renew of the lanes, bounded so that the renew
// still starts within this node's belief in its lanes (keeperTimeout), at
// the defaults' ratio of timings. On PostgreSQL the keeper runs no refresh
// of its own.
func TestLanesKeptThroughSlowMembershipRefreshes(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		seen := &slowSeen{DBProvider: p}
		a := startOn(t, tg, db, "a", func(c *cluster.Config) {
			c.Provider = seen
			c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = time.Second, 0, 0
		})
		if _, err := claimLane(ctx, a, "k"); err != nil {
			t.Fatal(err)
		}
		var lapses, samples int
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			samples++
			if !a.OwnsLane("k") {
				lapses++
			}
		}
		if tg.Dialect != cluster.Postgres && seen.n.Load() < 3 {
			t.Fatalf("%d membership refreshes in nine heartbeats; want one about each heartbeat", seen.n.Load())
		}
		t.Logf("%d slow membership refreshes, OwnsLane sampled %d times", seen.n.Load(), samples)
		if lapses > 0 || a.Lanes() == nil {
			t.Fatalf("OwnsLane was false at %d of %d samples over nine heartbeats of slow membership refreshes (%d); lanes now %v",
				lapses, samples, seen.n.Load(), a.Lanes())
		}
	})
}
