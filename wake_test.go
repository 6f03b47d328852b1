package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// Several nodes in one process on one database hand off without waiting
// for a poll: a release wakes the others at once, through any pools.
func TestInProcessWakeUp(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		// PollOnly turns off LISTEN only: releases in the process are heard.
		for _, pollOnly := range []bool{false, true} {
			t.Run(fmt.Sprintf("PollOnly=%v", pollOnly), func(t *testing.T) {
				mode := func(c *cluster.Config) { c.PollOnly = pollOnly }
				a := start(t, tg, "a", slow, mode)
				attempts := make(chan struct{}, 16)
				b := start(t, tg, "b", slow, mode, func(c *cluster.Config) {
					c.Observer = func(o cluster.Operation) {
						if o.Kind == cluster.OpAcquire && o.Outcome == cluster.OutcomeHeld {
							select {
							case attempts <- struct{}{}:
							default:
							}
						}
					}
				})
				if !a.IsLeader() {
					t.Fatal("a does not lead")
				}
				<-attempts // b just tried: its next poll is a heartbeat (5s) away
				if err := a.Resign(context.Background()); err != nil {
					t.Fatal(err)
				}
				// Well before b's next poll, with room for a loaded machine.
				took := waitFor(t, 3*time.Second, "b to take over when a resigned", b.IsLeader)
				t.Logf("b led %v after a resigned (its next poll was up to 5s away)", took.Round(time.Millisecond))
				if pollOnly && b.Stats().HearingReleases {
					t.Error("a PollOnly node reports that it hears releases (from other processes)")
				}
			})
		}
	})
}

// A PostgreSQL release commits with synchronous_commit off for its own
// transaction only: the connection it ran on goes back to the pool with
// the server's setting, so the application's commits on it stay durable.
func TestReleaseLeavesSynchronousCommitAlone(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	db := tg.Open(t)
	db.SetMaxOpenConns(1) // the release and the check below share the connection
	var before string
	if err := db.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&before); err != nil {
		t.Fatal(err)
	}
	a := startOn(t, tg, db, "a")
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := p.Leader(ctx, "leader"); err != nil || l != nil {
		t.Fatalf("after Shutdown the lease is held by %+v (%v); want it released", l, err)
	}
	var after string
	if err := db.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("synchronous_commit on the release's connection is %q after the release, %q before", after, before)
	}
}

// A release wakes one follower first, the successor it names; the others
// would try only after successorLead, and do not try at all once the
// successor's grant, announced in the process, cancels their wake-ups:
// they neither queue on the row behind it nor send statements that would
// be refused, and learn of the new term from the announcement. (Not parallel: it lengthens the lead to a bound no loaded
// machine reaches, so the order it checks is not timing.)
func TestReleaseWakesOneSuccessorFirst(t *testing.T) {
	const lead = 400 * time.Millisecond
	cluster.SetSuccessorLead(t, lead)
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		type attempt struct {
			node    string
			started time.Time
			outcome cluster.Outcome
		}
		var mu sync.Mutex
		var attempts []attempt
		observe := func(id string) func(*cluster.Config) {
			return func(c *cluster.Config) {
				c.Observer = func(o cluster.Operation) {
					if o.Kind == cluster.OpAcquire {
						mu.Lock()
						attempts = append(attempts, attempt{id, time.Now().Add(-o.Duration), o.Outcome})
						mu.Unlock()
					}
				}
			}
		}
		a := start(t, tg, "a", slow)
		followers := map[string]*node{}
		for _, id := range []string{"b", "c", "d"} {
			followers[id] = start(t, tg, id, slow, observe(id))
		}
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		// Each follower has made its first attempt (in New): the next poll
		// is a heartbeat (5s) away.
		mu.Lock()
		attempts = nil
		mu.Unlock()
		released := time.Now()
		if err := a.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		w := leaderOf(t, 3*time.Second, followers["b"], followers["c"], followers["d"])
		winner, token := w.NodeID(), w.FencingToken()
		// The others learn of the new term from the grant itself, without
		// the attempt it spared them: well before their delayed attempt
		// would have been due (lead), let alone their next poll (5s).
		for id, n := range followers {
			if id == winner {
				continue
			}
			waitFor(t, lead/2, id+" to learn that "+winner+" leads", func() bool {
				for _, e := range n.events.all() {
					if e.Kind == cluster.EventLeaderChanged && e.LeaderID == winner && e.FencingToken == token {
						return true
					}
				}
				return false
			})
		}
		// The others' delayed attempts, had they not been cancelled: each
		// waits lead to 2*lead.
		time.Sleep(2*lead + lead/2)
		mu.Lock()
		defer mu.Unlock()
		if len(attempts) != 1 {
			t.Errorf("%d attempts after the release, want the successor's alone", len(attempts))
		}
		for _, at := range attempts {
			after := at.started.Sub(released).Round(time.Millisecond)
			t.Logf("%s tried %v after the release: %v", at.node, after, at.outcome)
			switch {
			case at.node == winner && at.outcome == cluster.OutcomeOK:
				if after >= lead {
					t.Errorf("the successor %s tried %v after the release, not at once", at.node, after)
				}
			case at.node == winner:
				t.Errorf("the successor %s was refused before it led: %v", at.node, at.outcome)
			case after < lead*3/4:
				t.Errorf("%s, not the successor, tried %v after the release, before the successor's lead (%v) was over", at.node, after, lead)
			default:
				t.Errorf("%s, not the successor, tried %v after the release (%v): the successor's grant did not cancel its wake-up", at.node, after, at.outcome)
			}
		}
	})
}

// A successor the release names that will not take the lease (it holds off
// after its own Resign) passes the turn on: the other follower takes over
// at once, not after successorLead. On PostgreSQL the release names the
// member that has run longest, here the one holding off; elsewhere one of
// the process's watchers at random.
func TestSuccessorThatCannotLeadPassesOn(t *testing.T) {
	const lead = 2 * time.Second
	cluster.SetSuccessorLead(t, lead)
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		slowHoldOff := func(c *cluster.Config) {
			slow(c)
			c.ResignHoldOff = 15 * time.Second
		}
		nodes := map[string]*node{"a": start(t, tg, "a", slowHoldOff)}
		for _, id := range []string{"b", "c"} {
			nodes[id] = start(t, tg, id, slowHoldOff)
		}
		if !nodes["a"].IsLeader() {
			t.Fatal("a does not lead")
		}
		if err := nodes["a"].Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		x := leaderOf(t, 2*lead+time.Second, nodes["b"], nodes["c"]).NodeID() // a holds off
		y := map[string]string{"b": "c", "c": "b"}[x]
		time.Sleep(3 * lead) // every delayed attempt is over
		// a holds off for 15s; whichever of a and y is named, y leads.
		if err := nodes[x].Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, 2*lead+time.Second, y+" to take over when "+x+" resigned", nodes[y].IsLeader)
		t.Logf("%s led %v after %s resigned (a holds off; the others' lead is %v)", y, took.Round(time.Millisecond), x, lead)
		if took >= lead/4 { // (a bound below its own poll, which may come any time in 5s)
			t.Errorf("%s led %v after the release: it waited out the successor's lead (%v), so a, named and holding off, did not pass the turn on", y, took.Round(time.Millisecond), lead)
		}
	})
}

// slow gives nodes a poll so slow (every 5s) that a takeover within a
// fraction of it can only come from a wake-up.
func slow(c *cluster.Config) {
	c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 15*time.Second, 5*time.Second, 10*time.Second
}

// A PostgreSQL attempt that is refused commits without waiting for its
// WAL flush (its one write is the membership heartbeat); one that grants
// waits for it, as the term must outlive a server crash. The test runs the
// attempt inside a transaction of its own, where the setting the
// statement made for its transaction can still be read.
func TestRefusedAttemptCommitsAsynchronously(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	a := start(t, tg, "a")
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	db := tg.Open(t)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The session counts as warmed up, so no warm-up (which sets the
	// setting itself, for its scratch grants) runs after a refusal.
	if _, err := conn.ExecContext(ctx, "SELECT set_config('sqlfence."+tg.Prefix+"warm', '1', false)"); err != nil {
		t.Fatal(err)
	}
	var server string
	if err := conn.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&server); err != nil {
		t.Fatal(err)
	}
	if server == "off" {
		t.Skip("the server commits asynchronously anyway (synchronous_commit = off)")
	}
	for _, c := range []struct {
		lease, want string
		granted     bool
	}{
		{"leader", "off", false},    // a holds it
		{"elsewhere", server, true}, // free: granted
	} {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := cluster.NewSQLProvider(txPool{tx}, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Acquire(ctx, cluster.LeaseRequest{Name: c.lease, Holder: "b", Instance: "b-instance", TTL: testdb.LeaseTTL})
		var held *cluster.LeaseHeldError
		if got := err == nil; got != c.granted || (!got && !errors.As(err, &held)) {
			t.Fatalf("Acquire(%q) = %v, want granted %v", c.lease, err, c.granted)
		}
		var setting string
		if err := tx.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&setting); err != nil {
			t.Fatal(err)
		}
		if setting != c.want {
			t.Errorf("Acquire(%q), granted %v: synchronous_commit = %q for its transaction, want %q", c.lease, c.granted, setting, c.want)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}
	// Both in one transaction: the refusal's setting must not carry over
	// to the grant.
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	p, err := cluster.NewSQLProvider(txPool{tx}, tg.Dialect, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	var held *cluster.LeaseHeldError
	if _, err := p.Acquire(ctx, cluster.LeaseRequest{Name: "leader", Holder: "b", Instance: "b-instance", TTL: testdb.LeaseTTL}); !errors.As(err, &held) {
		t.Fatalf("Acquire(leader) = %v, want the lease held by a", err)
	}
	if _, err := p.Acquire(ctx, cluster.LeaseRequest{Name: "elsewhere", Holder: "b", Instance: "b-instance", TTL: testdb.LeaseTTL}); err != nil {
		t.Fatalf("Acquire(elsewhere) = %v, want it granted", err)
	}
	var setting string
	if err := tx.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting != "on" {
		t.Errorf("a grant after a refusal in one transaction: synchronous_commit = %q, want on", setting)
	}
}

// txPool is a cluster.Pool whose every connection is tx.
type txPool struct{ tx *sql.Tx }

func (p txPool) Conn(context.Context) (cluster.Querier, func(), error) {
	return &recordingTx{tx: p.tx}, func() {}, nil
}

// New returns only once the node hears the releases of the other nodes of
// its process: a release right after New returned (CI: TestInProcessWakeUp,
// a Resign a few milliseconds after the follower started) found nobody to
// wake, and the follower waited for its poll.
func TestNewReturnsHearing(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.SQLite)
	start(t, tg, "n0", slow, func(c *cluster.Config) { c.PollOnly = true })
	p, err := cluster.NewDBProvider(tg.Open(t), tg.Dialect, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Init(context.Background()); err != nil { // learns the database's identity
		t.Fatal(err)
	}
	for i := 1; i < 30; i++ {
		start(t, tg, fmt.Sprintf("n%d", i), slow, func(c *cluster.Config) { c.PollOnly = true })
		if got := cluster.LocalWatchers(p, "leader"); got != i+1 {
			t.Fatalf("right after New of node %d, %d nodes hear releases in this process; want %d", i+1, got, i+1)
		}
	}
}

// Shutdown, having released the lease to a node it can hear take it (here
// one of this process, on every dialect), returns only once that node's
// grant has committed: closing its connections, and whatever the
// application tears down after Shutdown returns, would otherwise compete
// with the successor's grant for the database. Its lease-released is its
// last event. Alone, it does not wait. (Not parallel: it lengthens the
// wait, a package variable, so that a loaded machine cannot outlast it.)
func TestShutdownWaitsForSuccessor(t *testing.T) {
	cluster.SetShutdownHandoffWait(t, 5*time.Second) // HeartbeatInterval (slow) bounds it too
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a", slow)
		b := start(t, tg, "b", slow)
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		if err := a.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		// Read from the database: b stores its term a moment after its
		// grant commits, which is what a hears.
		l, err := b.CurrentLeader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l == nil || l.NodeID != "b" {
			t.Fatalf("when a's Shutdown returned the lease was held by %+v; want b, which a woke, to have taken it", l)
		}
		if !cluster.HeardSuccessor(a.Cluster) {
			t.Error("a's Shutdown went on without hearing b take the lease")
		}
		if evs := a.events.all(); evs[len(evs)-1].Kind != cluster.EventLeaseReleased {
			t.Errorf("a's last event is %v; want lease-released", evs[len(evs)-1].Kind)
		}

		start := time.Now()
		if err := b.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("b's Shutdown, with no other member, took %v; want no wait for a successor", took)
		}
	})
}
