package cluster_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// A handler may call Shutdown, whatever the event: it returns promptly,
// the lease is released, the remaining events are delivered, and no
// goroutine is left.
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

	// The test's Shutdown waits for the handlers, one of which calls
	// Shutdown: that call must not wait for the first.
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
			b := start(t, tg, "b", withAudit(table), withHandler(h.handle))
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
			b, err := vaultNode(t, tg, "b", 1, func(c *cluster.Config) { c.AcceptVaultKeyRotation = true }, withHandler(h.handle))
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

// A Shutdown called while another is under way waits for it, and for the
// handlers' goroutine to exit when the first ran in a handler.
func TestShutdownWaitsForShutdownInHandler(t *testing.T) {
	t.Parallel()
	book := newLeaseBook()
	entered := make(chan struct{})
	proceed := make(chan struct{})
	h := shutdownOnKind(cluster.EventLeaseAcquired)
	// The lease-released event of the handler's Shutdown is held up here.
	a := startBook(t, book, h, withHandler(func(e cluster.Event) {
		if e.Kind == cluster.EventLeaseReleased {
			close(entered)
			<-proceed
		}
	}))
	if err := h.wait(t); err != nil {
		t.Fatalf("Shutdown from the handler = %v", err)
	}
	<-entered
	second := make(chan error, 1)
	go func() { second <- shutdownWithin(t, a.Cluster) }()
	select {
	case err := <-second:
		t.Fatalf("second Shutdown returned (%v) while a handler still ran", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(proceed)
	if err := <-second; err != nil {
		t.Fatalf("second Shutdown = %v", err)
	}
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
