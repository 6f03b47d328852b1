package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// Members lists every node process with its liveness by the database
// clock; exactly one is the leader, the one the lease row names; a node
// that shut down is listed as left, one that died stops being live after
// the node timeout.
func TestMembers(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		b := start(t, tg, "b")
		c := start(t, tg, "c", func(c *cluster.Config) { c.Role = cluster.RoleFollower })
		ms, err := c.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]cluster.Member{}
		leaders := 0
		for _, m := range ms {
			byID[m.NodeID] = m
			if m.Leader {
				leaders++
			}
		}
		if len(ms) != 3 || leaders != 1 || !byID["a"].Leader || !byID["a"].Live || !byID["b"].Live || byID["c"].Status != "active" || byID["b"].PID == 0 || byID["a"].Host == "" {
			t.Fatalf("members = %+v", ms)
		}

		b.Shutdown(ctx)
		ms, _ = c.Members(ctx)
		for _, m := range ms {
			if m.NodeID == "b" && (m.Status != "left" || m.Live) {
				t.Fatalf("after b's Shutdown: %+v", m)
			}
		}

		// A node that dies without a word: the refreshes stop.
		d := startOn(t, tg, tg.Open(t), "d", func(c *cluster.Config) { c.Role = cluster.RoleFollower })
		d.db.Close() // its database is gone: it can neither refresh nor leave
		d.Shutdown(ctx)
		timeout := time.Second + 3*100*time.Millisecond
		waitFor(t, timeout+2*time.Second, "the dead node to stop being live", func() bool {
			ms, _ := c.Members(ctx)
			for _, m := range ms {
				if m.NodeID == "d" {
					return !m.Live && m.Status == "active"
				}
			}
			return false
		})
		// The leader is still the only leader, and live: its refreshes go on.
		time.Sleep(timeout) // past a node timeout, to show the live stay live
		ms, _ = c.Members(ctx)
		for _, m := range ms {
			if (m.NodeID == "a") != m.Leader || (m.NodeID == "a" || m.NodeID == "c") != m.Live {
				t.Fatalf("after a node timeout: %+v", ms)
			}
			// SeenAgo is by the clock of the read that decided Live.
			if m.SeenAgo < 0 || m.Status == "active" && m.Live != (m.SeenAgo < timeout) {
				t.Errorf("member %s: live %v with SeenAgo %v and node timeout %v", m.NodeID, m.Live, m.SeenAgo, timeout)
			}
			if m.NodeID == "d" && m.SeenAgo < 2*timeout {
				t.Errorf("the dead node was seen %v ago, want at least %v", m.SeenAgo, 2*timeout)
			}
		}
		_ = a
	})
}

// A node that joins takes over the membership row of a member that left
// more than an hour ago, or of one still marked active but unseen for more
// than a week (its process died without Shutdown), oldest first, instead
// of adding one, so restarts do not grow the table. Rows of members marked
// active and seen within the week (a paused process may come back) are
// kept, and so are the rows of other lease names.
func TestMembershipRowsAreReused(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		admin := tg.Open(t)
		rows := func() int {
			t.Helper()
			var n int
			if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+tg.Prefix+"nodes").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		age := func(id string, d time.Duration) {
			t.Helper()
			q := fmt.Sprintf("UPDATE %snodes SET last_seen = last_seen - %d WHERE node_id = '%s'", tg.Prefix, d.Milliseconds(), id)
			if _, err := admin.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		follower := func(c *cluster.Config) { c.Role = cluster.RoleFollower }
		a := start(t, tg, "a")
		for _, id := range []string{"b1", "b2", "b3"} {
			start(t, tg, id, follower).Shutdown(ctx)
		}
		// Members of another lease name: one left long ago, one crashed.
		otherLease := func(c *cluster.Config) { c.LeaseName = "other" }
		start(t, tg, "other", follower, otherLease).Shutdown(ctx)
		oc := startOn(t, tg, tg.Open(t), "other-crashed", follower, otherLease)
		oc.db.Close()
		oc.Shutdown(ctx)
		// Members that died without Shutdown: their rows stay active.
		for _, id := range []string{"dead", "crashed"} {
			n := startOn(t, tg, tg.Open(t), id, follower)
			n.db.Close()
			n.Shutdown(ctx)
		}
		// b1 left 3 hours ago, b2 5, b3 half an hour ago (kept); dead and
		// other were seen 30 hours ago (dead kept, as it may be a paused
		// process), crashed 8 days ago (past crashedRetention).
		age("b1", 3*time.Hour)
		age("b2", 5*time.Hour)
		age("b3", 30*time.Minute)
		age("dead", 30*time.Hour)
		age("other", 30*time.Hour)
		age("crashed", 8*24*time.Hour)
		age("other-crashed", 9*24*time.Hour)
		if n := rows(); n != 8 {
			t.Fatalf("%d membership rows after eight nodes joined; want 8", n)
		}
		ids := func() []string {
			t.Helper()
			ms, err := a.Members(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range ms {
				ids = append(ids, m.NodeID)
				if len(m.NodeID) == 1 && m.NodeID != "a" {
					if !m.Live || m.Status != "active" || m.Leader || m.SeenAgo > time.Minute {
						t.Errorf("member %s in a taken-over row: %+v", m.NodeID, m)
					}
				}
			}
			slices.Sort(ids)
			return ids
		}
		// The oldest row goes first: crashed's, then b2's, then b1's.
		c := start(t, tg, "c", follower)
		if got, want := ids(), []string{"a", "b1", "b2", "b3", "c", "dead"}; !slices.Equal(got, want) {
			t.Fatalf("members after c joined: %v; want %v (c in crashed's row)", got, want)
		}
		start(t, tg, "d", follower)
		if got, want := ids(), []string{"a", "b1", "b3", "c", "d", "dead"}; !slices.Equal(got, want) {
			t.Fatalf("members after d joined: %v; want %v (d in b2's row)", got, want)
		}
		e := start(t, tg, "e", follower)
		if got, want := ids(), []string{"a", "b3", "c", "d", "dead", "e"}; !slices.Equal(got, want) {
			t.Fatalf("members after e joined: %v; want %v (e in b1's row)", got, want)
		}
		if n := rows(); n != 8 {
			t.Fatalf("%d membership rows after c, d and e joined; want 8", n)
		}
		// None is left to take (b3 left half an hour ago, dead was seen 30
		// hours ago, other and other-crashed are another lease's): the
		// next node adds a row.
		start(t, tg, "f", follower)
		if n := rows(); n != 9 {
			t.Fatalf("%d membership rows after f joined; want 9", n)
		}
		// A node in a taken-over row leaves it as its own.
		e.Shutdown(ctx)
		ms, err := c.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, m := range ms {
			if m.NodeID == "e" {
				found = true
				if m.Status != "left" || m.Live {
					t.Errorf("e after Shutdown: %+v", m)
				}
			}
		}
		if !found {
			t.Errorf("e is not listed after Shutdown: %+v", ms)
		}
	})
}

// A node whose membership row was taken over while it went unseen (a
// process paused for longer than a week) finds out at its next refresh
// and joins again, wherever it refreshes the row with a statement of its
// own: every node on MySQL and SQLite, a follower (RoleFollower) on
// PostgreSQL. A PostgreSQL candidate's lease statements refresh its row
// and do not report a missing one (see the README).
func TestMembershipRowTakenOverJoinsAgain(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		start(t, tg, "f", func(c *cluster.Config) { c.Role = cluster.RoleFollower })
		admin := tg.Open(t)
		takeOver := func(id string, round int) {
			t.Helper()
			q := fmt.Sprintf("UPDATE %snodes SET instance = 'taken-%s-%d', node_id = 'x-%s-%d' WHERE node_id = '%s'", tg.Prefix, id, round, id, round, id)
			res, err := admin.ExecContext(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != 1 {
				t.Fatalf("took over %d rows of %s, want 1", n, id)
			}
		}
		listed := func() bool { return liveMember(t, a.Cluster, "f") }
		takeOver("f", 0)
		if listed() {
			t.Fatal("f is listed right after its row was taken over")
		}
		// f refreshes every third heartbeat.
		waitFor(t, 20*testdb.Heartbeat, "f to join again", listed)
		if tg.Dialect == cluster.Postgres {
			return
		}

		// A leader that holds a lane refreshes its row twice over (every
		// third heartbeat, and the lanes' keeper every heartbeat); whichever
		// finds it gone, the row it joins again takes lanes again, so the
		// node counts towards the lanes' fair share. Several rounds, as the
		// two race.
		a.Shutdown(ctx)
		g := start(t, tg, "g")
		waitFor(t, 50*testdb.Heartbeat, "g to lead", g.IsLeader)
		if _, err := claimLane(ctx, g, "orders-1"); err != nil {
			t.Fatal(err)
		}
		takes := func() int { return takesLanes(t, tg, admin, "g") }
		waitFor(t, 20*testdb.Heartbeat, "g to take lanes", func() bool { return takes() == 1 })
		for round := 1; round <= 12; round++ {
			takeOver("g", round)
			waitFor(t, 20*testdb.Heartbeat, fmt.Sprintf("g to join again and take lanes (round %d)", round), func() bool { return takes() == 1 })
		}
	})
}

// A node whose membership could not be recorded at Init (the join timed
// out on a busy database, say) joins at a later heartbeat, and from then
// on is listed, whether or not it takes lanes (the lanes' keeper joined
// again; nothing else did): a candidate and a follower alike.
func TestMembershipJoinedAfterFailedJoinAtInit(t *testing.T) {
	const membershipSteps = 3 // membershipEvery
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		a := start(t, tg, "a")
		for _, c := range []struct {
			id   string
			role cluster.Role
		}{{"candidate", cluster.RoleLeader}, {"follower", cluster.RoleFollower}} {
			db := tg.Open(t)
			p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
			if err != nil {
				t.Fatal(err)
			}
			failing := &joinFailsOnce{DBProvider: p}
			startOn(t, tg, db, c.id, func(cfg *cluster.Config) {
				cfg.Provider, cfg.Role = failing, c.role
			})
			if !failing.failed.Load() {
				t.Fatalf("%s: Init did not try to join", c.id)
			}
			// A follower that hears releases steps once per LeaseTTL, and
			// joins at every third step.
			waitFor(t, 4*membershipSteps*testdb.LeaseTTL, c.id+" to be listed as a live member", func() bool { return liveMember(t, a.Cluster, c.id) })
		}
	})
}

// A node whose joins commit but whose answers are lost, until it shuts
// down, is marked left all the same: its row is there though it never
// learnt so (Shutdown leaves while a join is due).
func TestShutdownLeavesWhileJoinDue(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		a := start(t, tg, "a")
		db := tg.Open(t)
		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		lossy := &lossyJoins{DBProvider: p}
		lossy.lose.Store(1 << 30)
		f := startOn(t, tg, db, "f", func(c *cluster.Config) { c.Provider, c.Role = lossy, cluster.RoleFollower })
		waitFor(t, 50*testdb.Heartbeat, "f to join again", func() bool { return lossy.lose.Load() < 1<<30-1 })
		if err := f.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		ms, err := a.Members(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.NodeID == "f" && (m.Status != "left" || m.Live) {
				t.Fatalf("f after Shutdown: %+v; want status left, not live", m)
			}
		}
	})
}

// A join due after a failed one never delays the heartbeat: at the
// default ratio of timings (FenceTimeout two heartbeats) a join that ran
// to its bound of one heartbeat before each renew would start the renew
// when the leader's trust ran out, and the leader would lose its lease.
func TestJoinAgainDoesNotDelayRenew(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		db := tg.Open(t)
		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		joins := &slowJoins{DBProvider: p}
		a := startOn(t, tg, db, "a", func(c *cluster.Config) {
			c.Provider = joins
			// The defaults' ratio: a heartbeat of LeaseTTL/3, FenceTimeout
			// LeaseTTL minus a heartbeat.
			c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = time.Second, 0, 0
		})
		waitFor(t, 5*time.Second, "a to lead", a.IsLeader)
		time.Sleep(8 * time.Second / 3)
		if joins.n.Load() < 3 {
			t.Fatalf("%d joins in eight heartbeats; want the failed one and later ones", joins.n.Load())
		}
		if st := a.Stats(); st.SelfFences != 0 || st.Acquisitions != 1 || !a.IsLeader() {
			t.Fatalf("a after eight heartbeats of slow joins: %d self-fences, %d acquisitions, leads %v; want 0, 1, true",
				st.SelfFences, st.Acquisitions, a.IsLeader())
		}
	})
}

// A membership refresh never delays the renew: at the default ratio of
// timings a refresh that ran to a bound of one heartbeat before a renew
// would start it when the leader's trust ran out. On PostgreSQL, whose
// lease statements refresh the row, the leader checks the row every few
// heartbeats here (hourly by default).
func TestMembershipRefreshDoesNotDelayRenew(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		db := tg.Open(t)
		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		seen := &slowSeen{DBProvider: p}
		a := startOn(t, tg, db, "a", cluster.RowCheckEvery(500*time.Millisecond), func(c *cluster.Config) {
			c.Provider = seen
			// The defaults' ratio: a heartbeat of LeaseTTL/3, FenceTimeout
			// LeaseTTL minus a heartbeat.
			c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = time.Second, 0, 0
		})
		waitFor(t, 5*time.Second, "a to lead", a.IsLeader)
		time.Sleep(4 * time.Second)
		if seen.n.Load() < 2 {
			t.Fatalf("%d membership refreshes in twelve heartbeats; want several", seen.n.Load())
		}
		if st := a.Stats(); st.SelfFences != 0 || st.Acquisitions != 1 || !a.IsLeader() {
			t.Fatalf("a after twelve heartbeats of slow refreshes (%d): %d self-fences, %d acquisitions, leads %v; want 0, 1, true",
				seen.n.Load(), st.SelfFences, st.Acquisitions, a.IsLeader())
		}
	})
}

// A candidate whose membership row was taken over while it went unseen
// joins again, the leader and a follower alike: on MySQL and SQLite at
// its next refresh, on PostgreSQL, whose lease statements refresh the row
// without being able to tell it is gone, at its next check of the row
// (hourly; here every few heartbeats).
func TestCandidateMembershipRowTakenOverJoinsAgain(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		check := cluster.RowCheckEvery(5 * testdb.Heartbeat)
		a := start(t, tg, "a", check)
		waitFor(t, 50*testdb.Heartbeat, "a to lead", a.IsLeader)
		start(t, tg, "b", check)
		admin := tg.Open(t)
		listed := func(id string) bool { return liveMember(t, a.Cluster, id) }
		for _, id := range []string{"b", "a"} {
			waitFor(t, 20*testdb.Heartbeat, id+" to be listed", func() bool { return listed(id) })
			res, err := admin.ExecContext(ctx, bind(tg.Dialect, "UPDATE "+tg.Prefix+"nodes SET instance = ?, node_id = ? WHERE node_id = ?"), "taken-"+id, "x-"+id, id)
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != 1 {
				t.Fatalf("took over %d rows of %s, want 1", n, id)
			}
			if listed(id) {
				t.Fatalf("%s is listed right after its row was taken over", id)
			}
			waitFor(t, 30*testdb.Heartbeat, id+" to join again", func() bool { return listed(id) })
		}
		if !a.IsLeader() {
			t.Fatal("a stopped leading")
		}
	})
}

// On MySQL an UPDATE reports the rows it changed, and a refresh in the
// same millisecond as the last changes none: Seen must not take that for
// a row gone.
func TestSeenBackToBack(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		start(t, tg, "a") // creates the tables
		p, err := cluster.NewDBProvider(tg.Open(t), tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Join(ctx, "leader", cluster.Member{NodeID: "s", Instance: "s-1", Host: "h", PID: 1}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 200; i++ {
			if err := p.Seen(ctx, "leader", "s-1"); err != nil {
				t.Fatalf("Seen #%d of a member whose row is there: %v", i, err)
			}
		}
		if err := p.Seen(ctx, "leader", "gone-1"); err == nil {
			t.Fatal("Seen of an instance without a row succeeded")
		}
	})
}

// A node whose membership row was taken over joins again; when that
// join's answer is lost (it committed, the call failed), it joins once
// more, so that it takes lanes again and counts in their fair share.
// Without, the row was back, no refresh found it missing, and the lanes'
// keeper, which takes lanes again only after a join it counted, never
// did (seen as TestMembershipRowTakenOverJoinsAgain timing out on MariaDB
// in CI, when a join outlasted its heartbeat). A PostgreSQL candidate
// checks its row every few heartbeats here.
func TestMembershipJoinedAgainAfterItsAnswerWasLost(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		p, err := cluster.NewDBProvider(tg.Open(t), tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		lossy := &lossyJoins{DBProvider: p}
		g := start(t, tg, "g", cluster.RowCheckEvery(5*testdb.Heartbeat), func(c *cluster.Config) { c.Provider = lossy })
		waitFor(t, 50*testdb.Heartbeat, "g to lead", g.IsLeader)
		if _, err := claimLane(ctx, g, "orders-1"); err != nil {
			t.Fatal(err)
		}
		admin := tg.Open(t)
		takes := func() int { return takesLanes(t, tg, admin, "g") }
		waitFor(t, 20*testdb.Heartbeat, "g to take lanes", func() bool { return takes() == 1 })
		lossy.lose.Store(1)
		res, err := admin.ExecContext(ctx, bind(tg.Dialect, "UPDATE "+tg.Prefix+"nodes SET instance = ?, node_id = ? WHERE node_id = ?"), "taken-g", "x-g", "g")
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("took over %d rows of g, want 1", n)
		}
		waitFor(t, 40*testdb.Heartbeat, "g to join again and take lanes", func() bool { return takes() == 1 })
		if lossy.lose.Load() > 0 {
			t.Fatal("no join's answer was lost")
		}
	})
}
