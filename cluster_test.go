package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

func TestElectionOneLeader(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		a := start(t, tg, "a")
		b := start(t, tg, "b")
		c := start(t, tg, "c")
		watchSingleLeader(t, a, b, c)
		leader := leaderOf(t, 3*time.Second, a, b, c)
		token := leader.FencingToken()
		if token == 0 {
			t.Fatal("leader has fencing token 0")
		}
		// Leadership is stable while the leader renews. A sleep, as nothing
		// is to happen: longer than a lease, which would end unrenewed.
		time.Sleep(3 * testdb.LeaseTTL / 2)
		if !leader.IsLeader() || leader.FencingToken() != token {
			t.Fatalf("leader %s lost or changed term while renewing (token %d, was %d)", leader.NodeID(), leader.FencingToken(), token)
		}
		for _, n := range []*node{a, b, c} {
			l, err := n.CurrentLeader(context.Background())
			if err != nil {
				t.Fatalf("%s: CurrentLeader: %v", n.NodeID(), err)
			}
			if l == nil || l.NodeID != leader.NodeID() || l.FencingToken != token || l.Endpoint != leader.Endpoint() {
				t.Fatalf("%s: CurrentLeader = %+v, want %s with token %d", n.NodeID(), l, leader.NodeID(), token)
			}
			if n != leader {
				if n.FencingToken() != 0 {
					t.Errorf("follower %s reports token %d", n.NodeID(), n.FencingToken())
				}
				if err := n.RequireLeader(); !errors.Is(err, cluster.ErrNotLeader) || cluster.HTTPStatus(err) != http.StatusServiceUnavailable {
					t.Errorf("follower %s: RequireLeader = %v (status %d), want ErrNotLeader with 503", n.NodeID(), err, cluster.HTTPStatus(err))
				}
			}
		}
		if err := leader.RequireLeader(); err != nil {
			t.Fatalf("leader: RequireLeader = %v", err)
		}
		if e := leader.events.wait(t, cluster.EventLeaseAcquired, time.Second); e.FencingToken != token || e.NodeID != leader.NodeID() {
			t.Fatalf("acquired event = %+v, want token %d", e, token)
		}
	})
}

func TestHandoffAfterRelease(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		// A long TTL: the handoff must come from the release, not expiry.
		a := start(t, tg, "a", longLease)
		b := start(t, tg, "b", longLease)
		watchSingleLeader(t, a, b)
		if !a.IsLeader() {
			t.Fatal("first node does not lead after New")
		}
		old := a.FencingToken()
		if err := a.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if a.IsLeader() {
			t.Fatal("IsLeader is true after Shutdown")
		}
		took := waitFor(t, 3*time.Second, "b to lead", b.IsLeader)
		t.Logf("handoff took %v", took)
		if b.FencingToken() <= old {
			t.Fatalf("new token %d is not above old %d", b.FencingToken(), old)
		}
		e := a.events.wait(t, cluster.EventLeaseReleased, time.Second)
		if e.FencingToken != old || e.Reason != cluster.ReasonShutdown {
			t.Fatalf("released event = %+v", e)
		}
		if err := a.Shutdown(context.Background()); err != nil {
			t.Fatalf("second Shutdown: %v", err)
		}
		if err := a.RequireLeader(); !errors.Is(err, cluster.ErrNotLeader) {
			t.Fatalf("RequireLeader after Shutdown = %v", err)
		}
		if _, err := a.CurrentLeader(context.Background()); !errors.Is(err, cluster.ErrShutdown) {
			t.Fatalf("CurrentLeader after Shutdown = %v, want ErrShutdown", err)
		}
	})
}

// A cancelled caller still frees the lease.
func TestShutdownReleasesOnCancelledContext(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		a := start(t, tg, "a", longLease)
		b := start(t, tg, "b", longLease)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		a.Shutdown(ctx)
		waitFor(t, 3*time.Second, "b to lead", b.IsLeader)
	})
}

func TestTakeoverAfterCrash(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		a := start(t, tg, "a")
		b := start(t, tg, "b")
		watchSingleLeader(t, a, b)
		old := a.FencingToken()
		if old == 0 {
			t.Fatal("first node does not lead after New")
		}
		// The crash: a loses its database without releasing the lease.
		crashed := time.Now()
		a.db.Close()
		lost := a.events.wait(t, cluster.EventLeaseLost, 3*time.Second)
		if lost.Reason != cluster.ReasonSelfFenced || lost.FencingToken != old {
			t.Fatalf("lost event = %+v, want self-fenced with token %d", lost, old)
		}
		waitFor(t, 5*time.Second, "b to take over", b.IsLeader)
		t.Logf("takeover %v after the crash", time.Since(crashed))
		if b.FencingToken() <= old {
			t.Fatalf("token after takeover = %d, want above %d", b.FencingToken(), old)
		}
		if a.IsLeader() {
			t.Fatal("crashed node believes it leads")
		}
	})
}

func TestSameNodeIDTwice(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		first := start(t, tg, "dup")
		var logged strings.Builder
		var mu sync.Mutex
		second := start(t, tg, "dup", func(c *cluster.Config) {
			c.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil))
		})
		watchSingleLeader(t, first, second)
		if !first.IsLeader() {
			t.Fatal("first process does not lead")
		}
		token := first.FencingToken()
		// Three TTLs: the second never steals nor renews the live lease.
		deadline := time.Now().Add(3 * testdb.LeaseTTL)
		for time.Now().Before(deadline) {
			if second.IsLeader() {
				t.Fatal("second process with the same NodeID leads while the first holds the lease")
			}
			time.Sleep(10 * time.Millisecond) // sampling: nothing is to happen
		}
		if !first.IsLeader() || first.FencingToken() != token {
			t.Fatalf("first process lost its term (token %d, was %d)", first.FencingToken(), token)
		}
		mu.Lock()
		warned := strings.Count(logged.String(), "another process with this node id holds the lease")
		mu.Unlock()
		if warned != 1 {
			t.Fatalf("the duplicate node id was logged %d times, want once", warned)
		}
		first.Shutdown(context.Background())
		waitFor(t, 3*time.Second, "second to lead", second.IsLeader)
		if second.FencingToken() <= token {
			t.Fatalf("second got token %d, want above %d", second.FencingToken(), token)
		}
	})
}

// A follower wakes when the holder's lease expires by the database clock,
// not up to a heartbeat later.
func TestFollowerWakesAtExpiry(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		// A heartbeat long beside the lease, unlike testdb's: waking at the
		// expiry and polling once a heartbeat are then far apart.
		const ttl, heartbeat = 1500 * time.Millisecond, 600 * time.Millisecond
		slowPoll := func(c *cluster.Config) {
			c.LeaseTTL = ttl
			c.HeartbeatInterval = heartbeat
			c.FenceTimeout = 900 * time.Millisecond
		}
		a := start(t, tg, "a", slowPoll)
		b := start(t, tg, "b", slowPoll)
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		// Crash a right after a renew, so its lease has a full TTL left.
		afterRenew(t, tg, b.db)
		last := time.Now()
		a.db.Close()
		waitFor(t, 5*time.Second, "b to take over", b.IsLeader)
		took := time.Since(last)
		t.Logf("takeover %v after the last renew (TTL %v, heartbeat %v)", took.Round(time.Millisecond), ttl, heartbeat)
		if took > ttl+300*time.Millisecond {
			t.Fatalf("b took over %v after the last renew; polling once a heartbeat would explain up to %v", took, ttl+heartbeat)
		}
	})
}

func TestFollowerNeverLeads(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		follower := func(c *cluster.Config) { c.Role = cluster.RoleFollower }
		f := start(t, tg, "f", follower)
		// A sleep, here and below, as nothing is to happen: longer than a
		// lease, in which a candidate would have led.
		time.Sleep(3 * testdb.LeaseTTL / 2)
		if f.IsLeader() {
			t.Fatal("follower leads")
		}
		if l, err := f.CurrentLeader(context.Background()); err != nil || l != nil {
			t.Fatalf("CurrentLeader with no leader = %+v, %v", l, err)
		}
		a := start(t, tg, "a")
		if !a.IsLeader() {
			t.Fatal("a does not lead beside a follower")
		}
		f.events.wait(t, cluster.EventLeaderChanged, time.Second) // the follower reads the lease each heartbeat
		a.Shutdown(context.Background())
		waitFor(t, time.Second, "the follower to see the lease free", func() bool {
			for _, e := range f.events.all() {
				if e.Kind == cluster.EventLeaderChanged && e.LeaderID == "" {
					return true
				}
			}
			return false
		})
		time.Sleep(3 * testdb.LeaseTTL / 2)
		if f.IsLeader() {
			t.Fatal("follower took the released lease")
		}
		// A follower reports the terms it sees and nothing of its own.
		var seen []string
		for _, e := range f.events.all() {
			if e.Kind != cluster.EventLeaderChanged {
				t.Fatalf("follower had a transition: %+v", e)
			}
			seen = append(seen, fmt.Sprintf("%q/%d", e.LeaderID, e.FencingToken))
		}
		if want := []string{`"a"/1`, `""/1`}; !slices.Equal(seen, want) {
			t.Fatalf("follower observed %v, want %v (a's term, then the lease free)", seen, want)
		}
	})
}

// A leader cut off from its database stops believing it leads within
// FenceTimeout, before its lease can expire, and another node takes over
// only after that.
func TestSelfFenceWhenDatabaseStopsAnswering(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		if tg.Dialect == cluster.SQLite {
			selfFenceSQLite(t, tg)
			return
		}
		proxy := testdb.NewProxy(t, tg.Addr(t))
		a := startOn(t, tg, tg.OpenDSN(t, tg.WithAddr(t, proxy.Addr)), "a")
		b := start(t, tg, "b")
		watchSingleLeader(t, a, b)
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		old := a.FencingToken()
		blocked := time.Now()
		proxy.Block()
		took := waitFor(t, 3*time.Second, "a to self-fence", func() bool { return !a.IsLeader() })
		if took > testdb.FenceTimeout+300*time.Millisecond {
			t.Errorf("a believed it led %v after the database stopped answering; FenceTimeout is %v", took, testdb.FenceTimeout)
		}
		lost := a.events.wait(t, cluster.EventLeaseLost, 2*time.Second)
		if lost.Reason != cluster.ReasonSelfFenced {
			t.Fatalf("lost event = %+v, want self-fenced", lost)
		}
		waitFor(t, 5*time.Second, "b to take over", b.IsLeader)
		if since := time.Since(blocked); since < testdb.FenceTimeout {
			t.Fatalf("b took over %v after a was cut off, before a's trust window could end", since)
		}
		if b.FencingToken() <= old {
			t.Fatalf("b's token %d is not above %d", b.FencingToken(), old)
		}
		// Back on the network, a finds the lease taken and stays a follower.
		// A sleep, as nothing is to change: longer than a lease.
		proxy.Unblock()
		time.Sleep(3 * testdb.LeaseTTL / 2)
		if a.IsLeader() || !b.IsLeader() {
			t.Fatalf("after the partition healed: a leads %v, b leads %v", a.IsLeader(), b.IsLeader())
		}
	})
}

// On SQLite the database stops answering when another connection holds an
// exclusive lock on the file.
func selfFenceSQLite(t *testing.T, tg testdb.Target) {
	a := start(t, tg, "a")
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	blocker, err := tg.Open(t).Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close()
	if _, err := blocker.ExecContext(context.Background(), "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 3*time.Second, "a to self-fence", func() bool { return !a.IsLeader() })
	if took > testdb.FenceTimeout+300*time.Millisecond {
		t.Errorf("a believed it led %v after the database stopped answering; FenceTimeout is %v", took, testdb.FenceTimeout)
	}
	if lost := a.events.wait(t, cluster.EventLeaseLost, 2*time.Second); lost.Reason != cluster.ReasonSelfFenced {
		t.Fatalf("lost event = %+v, want self-fenced", lost)
	}
	if _, err := blocker.ExecContext(context.Background(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "a to lead again", a.IsLeader)
}

// IsLeader ends on time even when the heartbeat goroutine is stuck in a
// provider that ignores its context: the check reads the clock itself.
func TestTrustWindowEndsWithoutGoroutine(t *testing.T) {
	t.Parallel()
	stuck := make(chan struct{})
	p := &fakeProvider{RenewFunc: func(context.Context, provider.Lease, time.Duration) (provider.Lease, error) {
		<-stuck
		return provider.Lease{}, errors.New("unstuck")
	}}
	c := startFake(t, p)
	defer close(stuck)
	if !c.IsLeader() {
		t.Fatal("not leader after a successful first acquire")
	}
	took := waitFor(t, 3*time.Second, "IsLeader to turn false", func() bool { return !c.IsLeader() })
	if took > testdb.FenceTimeout+200*time.Millisecond {
		t.Fatalf("IsLeader stayed true %v with FenceTimeout %v", took, testdb.FenceTimeout)
	}
	if c.FencingToken() != 0 || c.RequireLeader() == nil {
		t.Fatal("FencingToken or RequireLeader disagree with IsLeader")
	}
}

// A renew's trust counts from when it was sent, not from its answer: an
// answer that took most of the window buys no time past FenceTimeout from
// the renew's start, which is what keeps the belief LeaseTTL -
// FenceTimeout ahead of the expiry the database counted from its own,
// later, reading of the clock.
func TestTrustCountsFromTheRenewsStart(t *testing.T) {
	t.Parallel()
	const slow = 400 * time.Millisecond // under the 540ms a renew may take with FenceTimeout 700ms and heartbeat 100ms
	var calls atomic.Int32
	var slowStart atomic.Int64 // unix nanoseconds
	stuck := make(chan struct{})
	var acquired atomic.Bool
	p := &fakeProvider{AcquireFunc: func(_ context.Context, r provider.LeaseRequest) (provider.Lease, error) {
		if acquired.Swap(true) { // one term: IsLeader stays false once it ends
			return provider.Lease{}, &cluster.LeaseHeldError{Holder: "other", Instance: "o", FencingToken: 2, Remaining: time.Second}
		}
		return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: 1}, nil
	}, RenewFunc: func(ctx context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
		switch calls.Add(1) {
		case 1:
			return l, nil
		case 2:
			slowStart.Store(time.Now().UnixNano())
			time.Sleep(slow)
			return l, nil // a success, answered late
		}
		select {
		case <-stuck:
		case <-ctx.Done():
		}
		return l, errors.New("no answer")
	}}
	c := startFake(t, p)
	defer close(stuck)
	waitFor(t, 3*time.Second, "the slow renew", func() bool { return slowStart.Load() != 0 })
	waitFor(t, 3*time.Second, "IsLeader to turn false", func() bool { return !c.IsLeader() })
	believed := time.Since(time.Unix(0, slowStart.Load()))
	if believed > testdb.FenceTimeout+150*time.Millisecond {
		t.Fatalf("IsLeader stayed true %v after the start of the last successful renew, which took %v; FenceTimeout is %v", believed, slow, testdb.FenceTimeout)
	}
}

// A failed renew is retried while the window lasts; one failure is not a
// lost lease.
func TestTransientRenewFailureKeepsLease(t *testing.T) {
	t.Parallel()
	failures := make(chan struct{}, 3)
	for range 3 {
		failures <- struct{}{}
	}
	p := &fakeProvider{RenewFunc: func(_ context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
		select {
		case <-failures:
			return l, errors.New("connection reset by peer")
		default:
			return l, nil
		}
	}}
	c := startFake(t, p)
	waitFor(t, 3*time.Second, "the failures to be used up", func() bool { return len(failures) == 0 })
	time.Sleep(3 * testdb.Heartbeat) // a sleep, as nothing is to happen: a lost lease would show
	if !c.IsLeader() {
		t.Fatal("three transient renew failures ended the lease")
	}
	for _, e := range c.events.all() {
		if e.Kind == cluster.EventLeaseLost {
			t.Fatalf("lease-lost after transient failures: %+v", e)
		}
	}
}

// A renew that finds the lease taken ends leadership at once.
func TestLeaseTakenEndsLeadership(t *testing.T) {
	t.Parallel()
	taken := make(chan struct{})
	p := &fakeProvider{
		RenewFunc: func(_ context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
			select {
			case <-taken:
				return l, cluster.ErrLeaseLost
			default:
				return l, nil
			}
		},
	}
	c := startFake(t, p)
	close(taken)
	e := c.events.wait(t, cluster.EventLeaseLost, 2*time.Second)
	if e.Reason != cluster.ReasonLeaseTaken {
		t.Fatalf("lost event = %+v, want reason %q", e, cluster.ReasonLeaseTaken)
	}
}

func TestCustomProviderErrorsAreNotFatal(t *testing.T) {
	t.Parallel()
	p := &fakeProvider{AcquireFunc: func(context.Context, provider.LeaseRequest) (provider.Lease, error) {
		return provider.Lease{}, errors.New("store unavailable")
	}}
	c := startFake(t, p) // a failed first acquire does not fail New
	if c.IsLeader() {
		t.Fatal("leads without a lease")
	}
}

// A node with the longest lease Validate accepts acquires once and keeps
// renewing: no deadline on the monotonic clock overflows into the past,
// which would make it self-fence and re-acquire in a loop.
func TestLongestLeaseTTLStaysLeader(t *testing.T) {
	t.Parallel()
	var acquires, renews atomic.Int64
	renewed := make(chan struct{}, 1)
	p := &fakeProvider{
		AcquireFunc: func(_ context.Context, r provider.LeaseRequest) (provider.Lease, error) {
			n := acquires.Add(1)
			return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: uint64(n)}, nil
		},
		RenewFunc: func(_ context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
			if renews.Add(1) >= 5 {
				select {
				case renewed <- struct{}{}:
				default:
				}
			}
			return l, nil
		},
	}
	log := newEventLog()
	cfg := fakeConfig(t, "a", p)
	cfg.LeaseTTL = cluster.MaxLeaseTTL
	cfg.FenceTimeout = 0 // the default, LeaseTTL - HeartbeatInterval
	cfg.Events = log.ch
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	select {
	case <-renewed:
	case <-time.After(5 * time.Second):
		t.Fatalf("%d renews and %d acquisitions in 5s; want renews of one term", renews.Load(), acquires.Load())
	}
	if !c.IsLeader() || acquires.Load() != 1 {
		t.Fatalf("after %d renews: IsLeader %v, %d acquisitions; want one term", renews.Load(), c.IsLeader(), acquires.Load())
	}
	for _, e := range log.all() {
		if e.Kind == cluster.EventLeaseLost {
			t.Fatalf("lost the lease: %+v", e)
		}
	}
}

// Lease names Validate accepts that differ in Go are different leases on
// every dialect: nodes can lead all of them at once. MySQL's utf8mb4_bin
// ignores trailing spaces, so "jobs" and "jobs " must not both be
// accepted.
func TestAcceptedLeaseNamesAreDistinct(t *testing.T) {
	t.Parallel()
	candidates := []string{"jobs", "jobs ", " jobs", "jobs  ", "Jobs", "JOBS", "job s", "é", "e\u0301", "ß", "ss", "jobs\u00a0"}
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		var nodes []*node
		for i, name := range candidates {
			if (cluster.Config{NodeID: "n", LeaseName: name, Provider: &fakeProvider{}}).Validate() != nil {
				continue
			}
			n := start(t, tg, fmt.Sprintf("n%d", i), func(c *cluster.Config) { c.LeaseName = name })
			nodes = append(nodes, n)
		}
		if len(nodes) < 8 {
			t.Fatalf("only %d of the names were accepted", len(nodes))
		}
		for _, n := range nodes {
			if !n.IsLeader() {
				l, err := n.CurrentLeader(context.Background())
				t.Errorf("node %s does not lead its own lease (leader %+v, %v)", n.NodeID(), l, err)
			}
			if n.FencingToken() != 1 {
				t.Errorf("node %s has token %d on a fresh lease; it shares a row", n.NodeID(), n.FencingToken())
			}
		}
	})
}

// The goroutine receiving events may call Shutdown, whatever the event:
// it returns promptly, the lease is released, and no goroutine is left.
func TestShutdownFromHandler(t *testing.T) {
	t.Parallel()
	reason := func(kind cluster.EventKind, reason cluster.Reason) func(cluster.Event) bool {
		return func(e cluster.Event) bool { return e.Kind == kind && e.Reason == reason }
	}

	t.Run("lease-acquired", func(t *testing.T) {
		t.Parallel()
		book := newLeaseBook()
		h := shutdownOnKind(cluster.EventLeaseAcquired)
		a := startBook(t, book, h)
		if err := h.wait(t); err != nil {
			t.Fatalf("Shutdown from the handler = %v", err)
		}
		if a.IsLeader() || book.held() {
			t.Fatalf("after Shutdown: IsLeader %v, lease held %v", a.IsLeader(), book.held())
		}
		if err := shutdownWithin(t, a.Cluster); err != nil {
			t.Fatalf("second Shutdown = %v", err)
		}
		// The release was reported after the handler returned.
		e := a.events.wait(t, cluster.EventLeaseReleased, time.Second)
		if e.FencingToken != 1 || e.Reason != cluster.ReasonShutdown {
			t.Fatalf("released event = %+v", e)
		}
	})

	t.Run("lease-lost/self-fenced", func(t *testing.T) {
		t.Parallel()
		book := newLeaseBook()
		h := shutdownOn(reason(cluster.EventLeaseLost, cluster.ReasonSelfFenced))
		a := startBook(t, book, h)
		book.failRenews()
		if err := h.wait(t); err != nil {
			t.Fatalf("Shutdown from the handler = %v", err)
		}
		if err := shutdownWithin(t, a.Cluster); err != nil {
			t.Fatalf("second Shutdown = %v", err)
		}
		if a.IsLeader() || book.held() {
			t.Fatalf("after Shutdown: IsLeader %v, lease held %v", a.IsLeader(), book.held())
		}
	})

	t.Run("lease-lost/lease-taken", func(t *testing.T) {
		t.Parallel()
		book := newLeaseBook()
		h := shutdownOn(reason(cluster.EventLeaseLost, cluster.ReasonLeaseTaken))
		a := startBook(t, book, h)
		book.take()
		if err := h.wait(t); err != nil {
			t.Fatalf("Shutdown from the handler = %v", err)
		}
		if err := shutdownWithin(t, a.Cluster); err != nil {
			t.Fatalf("second Shutdown = %v", err)
		}
		if a.IsLeader() || book.held() {
			t.Fatalf("after Shutdown: IsLeader %v, lease held by a %v", a.IsLeader(), book.held())
		}
	})

	// The receiver calls Shutdown during the test's: it waits for the
	// first, which does not wait for the receiver.
	t.Run("lease-released", func(t *testing.T) {
		t.Parallel()
		book := newLeaseBook()
		h := shutdownOnKind(cluster.EventLeaseReleased)
		a := startBook(t, book, h)
		if err := shutdownWithin(t, a.Cluster); err != nil {
			t.Fatalf("Shutdown = %v", err)
		}
		if err := h.wait(t); err != nil {
			t.Fatalf("Shutdown from the handler during the first = %v, want nil", err)
		}
		if book.held() {
			t.Fatal("lease still held")
		}
	})

	t.Run("rollback-detected", func(t *testing.T) {
		t.Parallel()
		testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
			ctx := context.Background()
			db, table, a := auditLeader(t, tg, 3)
			h := shutdownOnKind(cluster.EventRollbackDetected)
			b := start(t, tg, "b", withAudit(table), withHandler(t, h.handle))
			h.give(b.Cluster)
			if _, err := db.ExecContext(ctx, "DELETE FROM "+table+" WHERE monotonic_counter = 3"); err != nil {
				t.Fatal(err)
			}
			a.Shutdown(ctx) // b takes over and finds the chain rolled back
			if err := h.wait(t); err != nil {
				t.Fatalf("Shutdown from the handler = %v", err)
			}
			if err := shutdownWithin(t, b.Cluster); err != nil {
				t.Fatalf("second Shutdown = %v", err)
			}
			// b released the lease: a node without the chain leads at once.
			if c := start(t, tg, "c"); !c.IsLeader() {
				t.Fatal("the lease was not released")
			}
		})
	})

	t.Run("vault-key-rotated", func(t *testing.T) {
		t.Parallel()
		testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
			a, err := vaultNode(t, tg, "a", 0)
			if err != nil {
				t.Fatal(err)
			}
			a.Shutdown(context.Background())
			// The event is emitted during New, before the handler can have
			// its Cluster; it waits for it.
			h := shutdownOnKind(cluster.EventVaultKeyRotated)
			b, err := vaultNode(t, tg, "b", 1, func(c *cluster.Config) { c.AcceptVaultKeyRotation = true }, withHandler(t, h.handle))
			if err != nil {
				t.Fatal(err)
			}
			if !b.IsLeader() {
				t.Fatal("b does not lead after New")
			}
			h.give(b.Cluster)
			if err := h.wait(t); err != nil {
				t.Fatalf("Shutdown from the handler = %v", err)
			}
			if err := shutdownWithin(t, b.Cluster); err != nil {
				t.Fatalf("second Shutdown = %v", err)
			}
			// The lease was released: c leads at once, not after b's TTL
			// (a first attempt that times out on a loaded machine is
			// retried a heartbeat later).
			c, err := vaultNode(t, tg, "c", 1)
			if err != nil {
				t.Fatalf("after b's Shutdown from its handler: New = %v", err)
			}
			waitFor(t, testdb.LeaseTTL/2, "c to lead on the released lease", c.IsLeader)
		})
	})
}

// Shutdown lets a renew in flight finish before it releases, for up to
// half a heartbeat, rather than cancelling it: a statement cancelled in
// flight costs the driver its connection, and the release would then wait
// for a new one. A renew that outlasts that grace is cancelled. A
// follower's attempt in flight is let finish the same way.
func TestShutdownLetsRenewInFlightFinish(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		renew     time.Duration
		cancelled bool
	}{
		{"quick renew", testdb.Heartbeat / 4, false},
		{"stuck renew", time.Minute, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var armed, renewed atomic.Bool
			entered := make(chan struct{})
			var renewErr, releasedAfter atomic.Value
			p := &fakeProvider{
				RenewFunc: func(ctx context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
					if !armed.CompareAndSwap(true, false) {
						return l, nil
					}
					close(entered)
					select {
					case <-ctx.Done():
					case <-time.After(c.renew):
					}
					renewErr.Store(fmt.Sprint(ctx.Err()))
					renewed.Store(true)
					return l, ctx.Err()
				},
				ReleaseFunc: func(context.Context, provider.Lease) error {
					releasedAfter.Store(renewed.Load())
					return nil
				},
			}
			n, err := cluster.New(ctx, fakeConfig(t, "a", p))
			if err != nil {
				t.Fatal(err)
			}
			if !n.IsLeader() {
				t.Fatal("a does not lead")
			}
			armed.Store(true)
			select {
			case <-entered:
			case <-time.After(10 * testdb.Heartbeat):
				t.Fatal("no renew began")
			}
			start := time.Now()
			if err := n.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			if got := renewErr.Load(); (got != "<nil>") != c.cancelled {
				t.Errorf("the renew in flight ended with %v; want it cancelled: %v", got, c.cancelled)
			}
			if after, _ := releasedAfter.Load().(bool); !after {
				t.Error("the release ran before the renew in flight had ended")
			}
			if c.cancelled && took > 10*testdb.Heartbeat {
				t.Errorf("Shutdown took %v with a renew stuck in flight; want it cancelled after about half a heartbeat", took)
			}
		})
	}
}

func TestShutdownLetsAttemptInFlightFinish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var armed atomic.Bool
	entered := make(chan struct{})
	var attemptErr atomic.Value
	held := func(provider.LeaseRequest) error {
		// Due to expire at once: the next attempt follows within a heartbeat.
		return &cluster.LeaseHeldError{Holder: "other", Instance: "other-instance", FencingToken: 1, Remaining: time.Millisecond}
	}
	p := &fakeProvider{
		AcquireFunc: func(ctx context.Context, r provider.LeaseRequest) (provider.Lease, error) {
			if !armed.CompareAndSwap(true, false) {
				return provider.Lease{}, held(r)
			}
			close(entered)
			select {
			case <-ctx.Done():
			case <-time.After(testdb.Heartbeat / 4):
			}
			attemptErr.Store(fmt.Sprint(ctx.Err()))
			return provider.Lease{}, held(r)
		},
	}
	n, err := cluster.New(ctx, fakeConfig(t, "b", p))
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	select {
	case <-entered:
	case <-time.After(20 * testdb.Heartbeat):
		t.Fatal("no attempt began")
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := attemptErr.Load(); got != "<nil>" {
		t.Errorf("the attempt in flight ended with %v; want it let finish", got)
	}
}
