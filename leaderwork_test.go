package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// Leader work starts on acquisition with the term's token; on Shutdown it
// stops before the lease is released, so the next leader's work starts
// after it, even when it takes a while to stop.
func TestRunWhileLeaderShutdownOrder(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		log := &workLog{}
		a := start(t, tg, "a")
		b := start(t, tg, "b")
		runWork(t, a, log, 300*time.Millisecond)
		runWork(t, b, log, 0)
		waitFor(t, time.Second, "a's work to start", func() bool { _, ok := log.find("a", "start"); return ok })
		if e, _ := log.find("a", "start"); e.token != a.FencingToken() {
			t.Fatalf("a's work got token %d, a leads with %d", e.token, a.FencingToken())
		}
		if err := a.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		aStop, ok := log.find("a", "stop")
		if !ok {
			t.Fatal("Shutdown returned before a's work stopped")
		}
		waitFor(t, 2*time.Second, "b's work to start", func() bool { _, ok := log.find("b", "start"); return ok })
		bStart, _ := log.find("b", "start")
		if !bStart.at.After(aStop.at) {
			t.Fatalf("b's work started %v before a's stopped", aStop.at.Sub(bStart.at))
		}
		if bStart.token <= aStop.token {
			t.Fatalf("b's work got token %d, not above a's %d", bStart.token, aStop.token)
		}
	})
}

// When the leader is cut off from the database, its work's context is
// cancelled before its lease expires by the database clock, and before a
// follower can take over.
func TestRunWhileLeaderCancelledWhenCutOff(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		var a *node
		var cutOff, restore func()
		if tg.Dialect == cluster.SQLite {
			// No network to cut: hold SQLite's write lock instead, so no
			// renew can commit.
			a = start(t, tg, "a")
			blocker := tg.Open(t)
			var tx *sql.Tx
			cutOff = func() { tx = beginImmediate(t, blocker) }
			restore = func() { tx.Rollback() }
		} else {
			proxy := testdb.NewProxy(t, tg.Addr(t))
			a = startOn(t, tg, tg.OpenDSN(t, tg.WithAddr(t, proxy.Addr)), "a")
			cutOff, restore = proxy.Block, proxy.Close
		}
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		running := make(chan struct{}, 1)
		cancelled := make(chan time.Time, 1)
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- a.RunWhileLeader(wctx, func(ctx context.Context, token uint64) error {
				select {
				case running <- struct{}{}:
				default: // a later term; the test waits for the first
				}
				<-ctx.Done()
				cancelled <- time.Now()
				return nil
			})
		}()
		defer func() { stop(); <-done }()
		select {
		case <-running:
		case <-time.After(time.Second):
			t.Fatal("a's work did not start")
		}
		afterRenew(t, tg, tg.Open(t))
		row := readLease(t, tg, tg.Open(t))
		cutOff()
		var at time.Time
		select {
		case at = <-cancelled:
		case <-time.After(3 * time.Second):
			restore()
			t.Fatal("the work's context was not cancelled while a was cut off")
		}
		leader := a.IsLeader()
		restore()
		if leader {
			t.Fatal("IsLeader is true after the work's context was cancelled")
		}
		// The database's clock and this host's are the same clock here.
		if left := time.UnixMilli(row.expires).Sub(at); left <= 0 {
			t.Fatalf("the work's context was cancelled %v after the lease expired by the database clock", -left)
		} else {
			t.Logf("cancelled %v before the lease expired", left.Round(time.Millisecond))
		}
	})
}

// Resign moves the lease to another node within about one heartbeat, the
// resigner does not take it back during its hold-off, and a lone node that
// resigns leads again after it.
func TestResign(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		const holdOff = 500 * time.Millisecond
		hold := func(c *cluster.Config) { c.ResignHoldOff = holdOff }
		a := start(t, tg, "a", hold)
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		// Alone: leads again after the hold-off.
		began := time.Now()
		if err := a.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		e := a.events.wait(t, cluster.EventLeaseReleased, time.Second)
		if e.Reason != cluster.ReasonResigned {
			t.Fatalf("lease-released reason = %q, want %q", e.Reason, cluster.ReasonResigned)
		}
		if a.IsLeader() {
			t.Fatal("a leads right after Resign")
		}
		waitFor(t, 2*time.Second, "a lone resigner to lead again", a.IsLeader)
		if took := time.Since(began); took < holdOff {
			t.Fatalf("a led again %v after resigning, within its %v hold-off", took, holdOff)
		}

		// With another candidate: the lease moves to it.
		b := start(t, tg, "b", hold)
		watchSingleLeader(t, a, b)
		began = time.Now()
		if err := a.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, 2*time.Second, "b to lead after a resigned", b.IsLeader)
		t.Logf("b led %v after a resigned", took.Round(time.Millisecond))
		if took > testdb.Heartbeat+200*time.Millisecond {
			t.Errorf("b led %v after a resigned, want within one heartbeat (%v) and a round trip", took, testdb.Heartbeat)
		}
		time.Sleep(holdOff + testdb.Heartbeat) // a sleep, as a is not to take the lease back, even past its hold-off
		if a.IsLeader() {
			t.Fatal("a took the lease back from b")
		}
		if err := a.Resign(ctx); err != nil {
			t.Fatalf("Resign of a node that does not lead = %v, want nil", err)
		}
		a.Shutdown(ctx)
		if err := a.Resign(ctx); !errors.Is(err, cluster.ErrShutdown) || !errors.Is(err, cluster.ErrNotLeader) {
			t.Fatalf("Resign after Shutdown = %v, want ErrShutdown", err)
		}
	})
}

// Every follower learns of a takeover within about one heartbeat, with the
// new term's token, from the attempts it makes anyway.
func TestLeaderChangedReachesFollowers(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		b := start(t, tg, "b")
		c := start(t, tg, "c")
		pinned := start(t, tg, "p", func(c *cluster.Config) { c.Role = cluster.RoleFollower })
		nodes := []*node{a, b, c, pinned}
		hasTerm := func(n *node, leader string, token uint64) func() bool {
			return func() bool {
				for _, e := range n.events.all() {
					if e.Kind == cluster.EventLeaderChanged && e.LeaderID == leader && e.FencingToken == token {
						return true
					}
				}
				return false
			}
		}
		for _, n := range nodes {
			waitFor(t, time.Second, n.NodeID()+" to learn a leads", hasTerm(n, "a", a.FencingToken()))
		}
		old := a.FencingToken()
		a.Shutdown(ctx)
		next := leaderOf(t, 2*time.Second, b, c)
		token := next.FencingToken()
		if token <= old {
			t.Fatalf("new term has token %d after %d", token, old)
		}
		for _, n := range []*node{b, c, pinned} {
			took := waitFor(t, time.Second, n.NodeID()+" to learn of the new term", hasTerm(n, next.NodeID(), token))
			if took > testdb.Heartbeat+200*time.Millisecond {
				t.Errorf("%s learnt of the new term after %v, want within about one heartbeat (%v)", n.NodeID(), took, testdb.Heartbeat)
			}
		}
		for _, e := range b.events.all() {
			if e.Kind == cluster.EventLeaderChanged && e.LeaderID == next.NodeID() && e.LeaderEndpoint != "http://"+next.NodeID()+".test:8080" {
				t.Fatalf("leader-changed endpoint = %q", e.LeaderEndpoint)
			}
		}
	})
}

// A channel set in Config.Events gets the first acquisition, every
// time, even when it is made before New returns (100 runs per dialect).
func TestConfigHandlerSeesFirstAcquisition(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		db := tg.Open(t)
		var last uint64
		for i := range 100 {
			log := newEventLog()
			cfg := tg.Config(t, db, "a")
			cfg.Logger = nil
			cfg.Events = log.ch
			c, err := cluster.New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			// A lone node leads when New returns if its first attempt
			// succeeded; on a loaded machine that attempt may time out, and
			// the next one, a heartbeat later, leads.
			waitFor(t, time.Second, "a lone node to lead", c.IsLeader)
			err = c.Shutdown(context.Background())
			evs := log.all()
			if err != nil {
				// A release that outlasted its bound (one heartbeat, 100ms
				// here) during a stall of the database (seen once on MariaDB
				// in CI) is not what this test is about; anything else is.
				if n := len(evs); n == 0 || evs[n-1].Kind != cluster.EventLeaseReleased || evs[n-1].Reason != cluster.ReasonReleaseFailed {
					t.Fatal(err)
				}
				t.Logf("run %d: %v; waiting out the lease", i, err)
				time.Sleep(testdb.LeaseTTL)
			}
			if len(evs) == 0 || evs[0].Kind != cluster.EventLeaseAcquired || evs[0].FencingToken <= last {
				t.Fatalf("run %d: the Config handler saw %+v first, want lease-acquired with a token above %d", i, evs, last)
			}
			last = evs[0].FencingToken
		}
	})
}

// A node never releases its term while a renew of it is in flight. On
// PostgreSQL and MySQL a renew that read the database clock before the
// release, then waited for the release's row lock, re-checks its condition
// on the released row, still finds it unexpired by its earlier clock, and
// extends the lease the release just gave up: the followers it woke are
// refused until the lease expires. The fake holds one renew in flight while
// Resign or Shutdown releases.
func TestReleaseWaitsForRenewInFlight(t *testing.T) {
	for _, how := range []string{"Resign", "Shutdown"} {
		t.Run(how, func(t *testing.T) {
			var inFlight atomic.Int32
			var overlapped atomic.Bool
			var hold atomic.Bool
			held := make(chan struct{}, 1)
			unblock := make(chan struct{})
			p := &fakeProvider{
				RenewFunc: func(ctx context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
					inFlight.Add(1)
					defer inFlight.Add(-1)
					if hold.CompareAndSwap(true, false) {
						held <- struct{}{}
						select {
						case <-unblock:
						case <-ctx.Done():
							return l, ctx.Err()
						}
					}
					return l, nil
				},
				ReleaseFunc: func(context.Context, provider.Lease) error {
					if inFlight.Load() > 0 {
						overlapped.Store(true)
					}
					return nil
				},
			}
			a := startFake(t, p)
			waitFor(t, 5*time.Second, "a to lead", a.IsLeader)
			hold.Store(true)
			select {
			case <-held:
			case <-time.After(5 * time.Second):
				t.Fatal("no renew within 5s")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				if how == "Resign" {
					done <- a.Resign(ctx)
				} else {
					done <- a.Shutdown(ctx)
				}
			}()
			time.Sleep(50 * time.Millisecond) // long enough for a release that does not wait
			close(unblock)
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", how, err)
			}
			if overlapped.Load() {
				t.Fatalf("%s released the lease while a renew of the same term was in flight", how)
			}
			if a.IsLeader() {
				t.Fatalf("a leads after %s", how)
			}
		})
	}
}

// An acquisition answered after a heartbeat, but well within FenceTimeout,
// is kept: its term's trust window counts from the attempt's start. Bounded
// by one heartbeat, as it was, such an attempt committed after its caller
// gave up, and the next one found the lease held by the node itself,
// released it and tried again, as slowly: on a database slowed down by
// load (1000 members through PgBouncer), no node led for seconds.
func TestSlowAcquisitionIsKept(t *testing.T) {
	book := newLeaseBook()
	p := book.provider()
	grant := p.AcquireFunc
	p.AcquireFunc = func(ctx context.Context, r provider.LeaseRequest) (provider.Lease, error) {
		l, err := grant(ctx, r) // committed now; the answer is slow
		select {
		case <-time.After(testdb.Heartbeat * 3 / 2):
			return l, err
		case <-ctx.Done():
			return provider.Lease{}, ctx.Err()
		}
	}
	a := startFake(t, p)
	waitFor(t, 5*time.Second, "a to lead", a.IsLeader)
	if tok := a.FencingToken(); tok != 1 {
		t.Fatalf("a leads with fencing token %d; want the first grant, 1", tok)
	}
}

// workLog records what leader work did, with monotonic timestamps, shared
// by the nodes of one test.
type workLog struct {
	mu      sync.Mutex
	entries []workEntry
}

type workEntry struct {
	node, what string
	token      uint64
	at         time.Time
}

func (l *workLog) add(node, what string, token uint64) {
	l.mu.Lock()
	l.entries = append(l.entries, workEntry{node, what, token, time.Now()})
	l.mu.Unlock()
}

func (l *workLog) find(node, what string) (workEntry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.entries {
		if e.node == node && e.what == what {
			return e, true
		}
	}
	return workEntry{}, false
}

// runWork runs leader work on n until the test ends: it logs start with the
// term's token, waits for its context, then takes linger to stop (as work
// finishing a batch would) and logs stop.
func runWork(t *testing.T, n *node, log *workLog, linger time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- n.RunWhileLeader(ctx, func(ctx context.Context, token uint64) error {
			log.add(n.NodeID(), "start", token)
			<-ctx.Done()
			time.Sleep(linger) // a sleep: work that takes linger to stop
			log.add(n.NodeID(), "stop", token)
			return ctx.Err()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) && !errors.Is(err, cluster.ErrShutdown) {
			t.Errorf("RunWhileLeader returned %v", err)
		}
	})
}
