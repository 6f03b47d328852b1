package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

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

// laneEvents returns the lane events of l, as "kind key token reason".
func laneEvents(l *eventLog) []string {
	var out []string
	for _, e := range l.all() {
		if strings.HasPrefix(string(e.Kind), "lane-") {
			out = append(out, strings.TrimSpace(fmt.Sprintf("%s %s %d %s", e.Kind, e.Lane, e.FencingToken, e.Reason)))
		}
	}
	return out
}

// A node's lane events tell its claims from their ends, each with the
// lane's token: a claim, a release, a lane an operator released behind
// its back, a shutdown. Stats counts them, and the Observer sees every
// lane statement with its outcome: ok, held, limit.
func TestLaneEventsStatsAndObserver(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		ops, bops := &opLog{}, &opLog{}
		a := start(t, tg, "a", func(c *cluster.Config) { c.Observer = ops.add; c.MaxLanes = 1 })
		b := start(t, tg, "b", func(c *cluster.Config) { c.Observer = bops.add })

		if _, err := claimLane(ctx, a, "k1"); err != nil {
			t.Fatal(err)
		}
		if e := a.events.wait(t, cluster.EventLaneAcquired, time.Second); e.Lane != "k1" || e.FencingToken != 1 || e.NodeID != "a" {
			t.Fatalf("lane-acquired = %+v", e)
		}
		if s := a.Stats(); s.LanesHeld != 1 || s.LaneAcquisitions != 1 {
			t.Fatalf("stats after a claim: %+v", s)
		}
		if _, err := claimLane(ctx, b, "k1"); !errors.Is(err, cluster.ErrLaneHeld) {
			t.Fatalf("b's claim of a's lane = %v", err)
		}
		if bops.count(cluster.OpClaimLane, cluster.OutcomeHeld) != 1 || ops.count(cluster.OpClaimLane, cluster.OutcomeOK) != 1 {
			t.Fatalf("claims observed: a %+v, b %+v", ops.ops, bops.ops)
		}
		waitFor(t, 2*time.Second, "a lane renewal observed", func() bool { return ops.count(cluster.OpRenewLanes, cluster.OutcomeOK) > 0 })

		if err := a.ReleaseLane(ctx, "k1"); err != nil {
			t.Fatal(err)
		}
		if ops.count(cluster.OpReleaseLane, cluster.OutcomeOK) != 1 {
			t.Fatalf("release not observed: %+v", ops.ops)
		}

		// An operator ends a's claim on k2: a's keeper finds it gone.
		if _, err := claimLane(ctx, a, "k2"); err != nil {
			t.Fatal(err)
		}
		p, err := cluster.NewDBProvider(tg.Open(t), tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := p.ForceReleaseLane(ctx, "leader", "k2", 1); !ok || err != nil {
			t.Fatalf("ForceReleaseLane = %v, %v", ok, err)
		}
		if e := a.events.wait(t, cluster.EventLaneLost, 2*time.Second); e.Lane != "k2" || e.Reason != cluster.ReasonLaneTaken || e.FencingToken != 1 {
			t.Fatalf("lane-lost = %+v", e)
		}
		if a.OwnsLane("k2") || a.Stats().LanesHeld != 0 {
			t.Fatalf("a owns k2 after losing it: %+v", a.Stats())
		}

		// MaxLanes 1: a second lane is refused, and observed as such.
		if _, err := claimLane(ctx, a, "k3"); err != nil {
			t.Fatal(err)
		}
		if _, err := claimLane(ctx, a, "k4"); !errors.Is(err, cluster.ErrLaneLimit) {
			t.Fatalf("claim above MaxLanes = %v", err)
		}
		if ops.count(cluster.OpClaimLane, cluster.OutcomeLimit) != 1 {
			t.Fatalf("limit not observed: %+v", ops.ops)
		}

		if err := a.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		want := []string{
			"lane-acquired k1 1",
			"lane-released k1 1 released",
			"lane-acquired k2 1",
			"lane-lost k2 1 lane-taken",
			"lane-acquired k3 1",
			"lane-released k3 1 shutdown",
		}
		if got := laneEvents(a.events); !slices.Equal(got, want) {
			t.Fatalf("a's lane events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if s := a.Stats(); s.LaneAcquisitions != 3 || s.LaneReleases != 2 || s.LaneLosses != 1 || s.LanesHeld != 0 {
			t.Fatalf("stats after Shutdown: %+v", s)
		}
		if ops.count(cluster.OpReleaseLane, cluster.OutcomeOK) != 2 {
			t.Fatalf("Shutdown's release not observed: %+v", ops.ops)
		}
		if got := laneEvents(b.events); len(got) != 0 {
			t.Fatalf("b, which claimed nothing, emitted %v", got)
		}
	})
}

// renewFails is the default provider whose lane renewals fail while fail
// is set, as when the keeper is cut off from the database.
type renewFails struct {
	*cluster.DBProvider
	fail atomic.Bool
}

func (p *renewFails) RenewLanes(ctx context.Context, scope, instance string, ttl, window time.Duration) (provider.LaneReport, error) {
	if p.fail.Load() {
		return provider.LaneReport{}, errors.New("renew lanes: connection refused")
	}
	return p.DBProvider.RenewLanes(ctx, scope, instance, ttl, window)
}

// A node whose keeper cannot renew its lanes stops owning them before they
// can expire, and says so (lane-lost, self-fenced); when the database
// answers again and the lane is still its own, it owns it again, under the
// same token.
func TestLaneSelfFenced(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		rp := &renewFails{DBProvider: p}
		// A lane lasts 5s: it stays this node's, by the database clock, for
		// 3s after this node stops believing in it (FenceTimeout, 2s, after
		// its last renewal).
		a := startOn(t, tg, db, "a", func(c *cluster.Config) {
			c.Provider, c.LeaseTTL, c.FenceTimeout = rp, 5*time.Second, 2*time.Second
		})
		token, err := claimLane(ctx, a, "k")
		if err != nil {
			t.Fatal(err)
		}
		rp.fail.Store(true)
		e := a.events.wait(t, cluster.EventLaneLost, 4*time.Second)
		if e.Lane != "k" || e.Reason != cluster.ReasonSelfFenced || e.FencingToken != token {
			t.Fatalf("lane-lost = %+v", e)
		}
		if a.OwnsLane("k") {
			t.Fatal("a owns the lane it lost")
		}
		rp.fail.Store(false)
		waitFor(t, 3*time.Second, "a to own k again", func() bool { return a.OwnsLane("k") })
		// Events are delivered on a goroutine of their own: OwnsLane can
		// turn true before the handler has seen lane-acquired.
		waitFor(t, 2*time.Second, "the third lane event", func() bool { return len(laneEvents(a.events)) >= 3 })
		want := []string{
			fmt.Sprintf("lane-acquired k %d", token),
			fmt.Sprintf("lane-lost k %d self-fenced", token),
			fmt.Sprintf("lane-acquired k %d", token),
		}
		if got := laneEvents(a.events); !slices.Equal(got, want) {
			t.Fatalf("lane events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// A claim reads only the lanes that matter now, not every lane the lease
// name ever used: with 5,000 released lanes that this node's process once
// held, a claim of a new lane (its fair-share census and the claim, in the
// caller's transaction) reads far fewer rows of the lanes table than that,
// as counted by the server for the transaction (PostgreSQL's
// pg_stat_xact_user_tables) or the session (MariaDB's Handler_read
// counters). Before, the census read every lane of the scope, and every
// lane the instance had held, on each claim and each keeper heartbeat.
// BenchmarkLaneHistory measures the time; SQLite's plans are checked by
// TestLaneQueriesUseIndexes.
func TestLaneClaimReadsNoHistory(t *testing.T) {
	t.Parallel()
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			const history = 5000
			tg := testdb.New(t, d)
			db := tg.Open(t)
			a := startOn(t, tg, db, "a")
			ctx := context.Background()
			members, err := a.Members(ctx)
			if err != nil || len(members) != 1 {
				t.Fatal(members, err)
			}
			addHistory(t, tg, db, "a", members[0].Instance, history)
			analyze := "ANALYZE " + tg.Prefix + "lanes"
			if tg.Dialect == cluster.MySQL {
				analyze = "ANALYZE TABLE " + tg.Prefix + "lanes"
			}
			if _, err := db.Exec(analyze); err != nil {
				t.Fatal(err)
			}

			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			tx, err := conn.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			before := rowsRead(t, tg, tx)
			if _, err := a.ClaimLane(ctx, tx, "fresh"); err != nil {
				t.Fatal(err)
			}
			read := rowsRead(t, tg, tx) - before
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if read >= history/10 {
				t.Fatalf("a claim read %d rows of the lanes table, which holds %d released lanes: it reads the history", read, history)
			}
			t.Logf("a claim read %d rows beside %d released lanes", read, history)
		})
	}
}

// addHistory adds n lanes of lease name "leader" that node holder's
// process instance held and released an hour ago, in batches of 1000
// rows, with their high-water marks (written by the guards).
func addHistory(t testing.TB, tg testdb.Target, db *sql.DB, holder, instance string, n int) {
	t.Helper()
	ago := strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10)
	for done := 0; done < n; {
		var q strings.Builder
		q.WriteString("INSERT INTO " + tg.Prefix + "lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) VALUES ")
		for j := 0; j < 1000 && done < n; j++ {
			if j > 0 {
				q.WriteString(", ")
			}
			q.WriteString("('leader', 'old-" + strconv.Itoa(done) + "', '" + holder + "', '" + instance + "', 1, " + ago + ", " + ago + ", " + ago + ")")
			done++
		}
		if _, err := db.Exec(q.String()); err != nil {
			t.Fatal(err)
		}
	}
}

// rowsRead is the server's count of rows of the lanes table read in tx
// (PostgreSQL) or of rows read on tx's session (MySQL).
func rowsRead(t *testing.T, tg testdb.Target, tx *sql.Tx) int64 {
	t.Helper()
	ctx := context.Background()
	if tg.Dialect == cluster.Postgres {
		var n int64
		if err := tx.QueryRowContext(ctx, "SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables WHERE relid = $1::regclass",
			tg.Prefix+"lanes").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rows, err := tx.QueryContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_read%'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			t.Fatal(err)
		}
		if name == "Handler_read_next" || name == "Handler_read_prev" || name == "Handler_read_rnd_next" {
			n += v
		}
	}
	return n
}

// Helpers of the lane tests: claims in a transaction of their own, the
// per-lane write log (laneWrite mirrors fencedWrite, one sequence per
// lane), and a watcher of lane ownership.

// laneEntry is a row of a lane's log.
type laneEntry struct {
	seq, token int64
	node       string
}

// What lanes and the config version add to a node's steady-state load:
// three followers of one leader, one plain, one that holds two lanes (and
// reads the config version in its lanes' heartbeat), one that only
// watches the config version. BENCHMARKS.md quotes the figures this logs:
//
//	go test -run TestLaneStatements -v .
func TestLaneStatements(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		var plainN, lanesN, configN atomic.Int64
		leader := start(t, tg, "leader")
		startOn(t, tg, openCounting(t, tg, &plainN), "plain")
		lanes := startOn(t, tg, openCounting(t, tg, &lanesN), "lanes")
		config := startOn(t, tg, openCounting(t, tg, &configN), "config")
		if !leader.IsLeader() {
			t.Fatal("the first node does not lead")
		}
		for _, k := range []string{"k1", "k2"} {
			if _, err := claimLane(ctx, lanes, k); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := lanes.ConfigVersion(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := config.ConfigVersion(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // a few heartbeats: not a wait for a transition
		p0, l0, c0 := plainN.Load(), lanesN.Load(), configN.Load()
		const beats = 30
		time.Sleep(beats * 100 * time.Millisecond) // counting over a fixed window
		p := float64(plainN.Load()-p0) / beats
		l := float64(lanesN.Load()-l0) / beats
		c := float64(configN.Load()-c0) / beats
		t.Logf("%s: statements per heartbeat: follower %.2f; with 2 lanes and the config version %.2f (+%.2f); watching the config version %.2f (+%.2f)",
			tg.Dialect, p, l, l-p, c, c-p)
		if !lanes.OwnsLane("k1") || !lanes.OwnsLane("k2") {
			t.Fatal("the lanes were not kept")
		}
		// Sanity bounds, generous for a loaded machine: lanes add at most
		// three statements per heartbeat, the config version one.
		if l-p > 3.6 || c-p > 1.6 {
			t.Errorf("more statements than the design allows: lanes +%.2f, config +%.2f per heartbeat", l-p, c-p)
		}
	})
}

// BenchmarkOwnsLane measures the per-item check of a partitioned worker:
// a binary search of an immutable snapshot and one clock read, with 0
// allocs/op. The node owns 64 lanes; "miss" asks for one it does not own.
// See BENCHMARKS.md.
func BenchmarkOwnsLane(b *testing.B) {
	tg := testdb.New(b, cluster.SQLite)
	db := tg.Open(b)
	cfg := tg.Config(b, db, "bench")
	cfg.Logger = nil
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	ctx := context.Background()
	for i := range 64 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.ClaimLane(ctx, tx, fmt.Sprintf("partition-%02d", i)); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("hit/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !c.OwnsLane("partition-42") {
				b.Fatal("lost the lane")
			}
		}
	})
	b.Run("miss/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if c.OwnsLane("partition-99") {
				b.Fatal("owns a lane it never claimed")
			}
		}
	})
	b.Run("hit/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !c.OwnsLane("partition-42") {
					b.Error("lost the lane")
					return
				}
			}
		})
	})
}

// BenchmarkLaneHistory measures a claim and release of a lane never used
// before (one op: begin, ClaimLane, commit, ReleaseLane) on a node whose
// lease name already has history released lanes, all once held by this
// node's process: services key lanes by tenant, partition or order id,
// so history grows without end, and a claim must not slow down with it.
// It reports the median (median-ms/op) besides the mean. Run with a fixed
// count, as BENCHMARKS.md does:
//
//	go test -run '^$' -bench BenchmarkLaneHistory -benchtime 200x .
func BenchmarkLaneHistory(b *testing.B) {
	for _, d := range testdb.Dialects {
		for _, history := range []int{0, 20_000, 200_000} {
			b.Run(fmt.Sprintf("%s/history=%d", d, history), func(b *testing.B) {
				tg := testdb.New(b, d)
				db := tg.Open(b)
				cfg := tg.Config(b, db, "bench")
				cfg.Logger = nil
				ctx := context.Background()
				c, err := cluster.New(ctx, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Shutdown(ctx)
				members, err := c.Members(ctx)
				if err != nil || len(members) != 1 {
					b.Fatal(members, err)
				}
				addLaneHistory(b, tg, db, members[0].Instance, history)
				var took []time.Duration
				i := 0
				for b.Loop() {
					key := fmt.Sprintf("fresh-%d", i)
					i++
					start := time.Now()
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.ClaimLane(ctx, tx, key); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
					if err := c.ReleaseLane(ctx, key); err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
				}
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "median-ms/op")
			})
		}
	}
}

// addLaneHistory is addHistory, then, on PostgreSQL, a VACUUM ANALYZE
// of what it inserted.
func addLaneHistory(b *testing.B, tg testdb.Target, db *sql.DB, instance string, n int) {
	b.Helper()
	addHistory(b, tg, db, "bench", instance, n)
	// A history that grew over days has been vacuumed and analyzed by
	// then (PostgreSQL's autovacuum would start on these rows during the
	// measurement otherwise); the other dialects keep their statistics
	// as they are, as their servers do.
	if tg.Dialect == cluster.Postgres {
		for _, table := range []string{"lanes", "high_water"} {
			if _, err := db.Exec("VACUUM ANALYZE " + tg.Prefix + table); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// A second live process with the same NodeID is refused lanes, as it is
// refused the lease, while the process that has the NodeID first runs;
// that one keeps claiming; once it shuts down the duplicate may claim.
func TestDuplicateNodeIDRefusedLanes(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		first := start(t, tg, "a")
		waitFor(t, 50*testdb.Heartbeat, "the first a to lead", first.IsLeader)
		if _, err := claimLane(ctx, first, "k1"); err != nil {
			t.Fatalf("the first a's claim: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // a later started_at, by the database clock
		dup := start(t, tg, "a")
		_, err := claimLane(ctx, dup, "k2")
		if !errors.Is(err, cluster.ErrDuplicateNodeID) || errors.Is(err, cluster.ErrLaneHeld) {
			t.Fatalf("the duplicate's claim = %v, want ErrDuplicateNodeID", err)
		}
		if dup.OwnsLane("k2") || len(dup.Lanes()) != 0 {
			t.Fatalf("the refused duplicate believes it owns %v", dup.Lanes())
		}
		if _, err := claimLane(ctx, first, "k3"); err != nil {
			t.Fatalf("the first a's claim beside its duplicate: %v", err)
		}
		if err := first.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := claimLane(ctx, dup, "k2"); err != nil {
			t.Fatalf("the duplicate's claim once the first a left: %v", err)
		}
	})
}
