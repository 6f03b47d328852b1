package providertest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

// The Memory passes the suite it ships with, on the real clock (the
// suite waits for a lease to expire). Every node of a store shares one
// Memory, as the nodes of a test do.
func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	t.Run("NewMemory", func(t *testing.T) {
		t.Parallel()
		providertest.Run(t, func(t *testing.T) func() provider.Provider {
			m := providertest.NewMemory(nil)
			return func() provider.Provider { return m }
		})
	})
	t.Run("ZeroValue", func(t *testing.T) {
		t.Parallel()
		providertest.Run(t, func(t *testing.T) func() provider.Provider {
			m := new(providertest.Memory)
			return func() provider.Provider { return m }
		})
	})
}

// The Memory passes the lane suite too, without transactions.
func TestMemoryLaneConformance(t *testing.T) {
	t.Parallel()
	providertest.RunLanes(t, func(t *testing.T) providertest.LaneTarget {
		m := providertest.NewMemory(nil)
		return providertest.LaneTarget{
			Open:  func() provider.LaneStore { return m },
			Begin: func(context.Context) (providertest.Tx, error) { return providertest.NoTx, nil },
		}
	})
}

func request(holder string, ttl time.Duration) provider.LeaseRequest {
	return provider.LeaseRequest{Name: "leader", Holder: holder, Instance: holder + "-instance", Endpoint: "https://" + holder, TTL: ttl}
}

func mustAcquire(t *testing.T, m *providertest.Memory, r provider.LeaseRequest) provider.Lease {
	t.Helper()
	l, err := m.Acquire(t.Context(), r)
	if err != nil {
		t.Fatalf("Acquire by %s: %v", r.Holder, err)
	}
	return l
}

func mustHold(t *testing.T, m *providertest.Memory, holder string, token uint64) {
	t.Helper()
	l, err := m.Leader(t.Context(), "leader")
	if err != nil || l == nil || l.NodeID != holder || l.FencingToken != token {
		t.Fatalf("Leader = %+v, %v; want %s with token %d", l, err, holder, token)
	}
}

func mustBeFree(t *testing.T, m *providertest.Memory) {
	t.Helper()
	if l, err := m.Leader(t.Context(), "leader"); l != nil || err != nil {
		t.Fatalf("Leader = %+v, %v; want nil, nil", l, err)
	}
}

// The lease expires exactly when the Clock reaches its expiry, and the
// times the Memory reports are the Clock's.
func TestMemoryExpiresByClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := providertest.NewClock(start)
	m := providertest.NewMemory(clock.Now)
	a := mustAcquire(t, m, request("a", 10*time.Second))
	if want := start.Add(10 * time.Second); !a.ExpiresAt.Equal(want) {
		t.Fatalf("ExpiresAt = %v, want %v", a.ExpiresAt, want)
	}

	clock.Advance(9 * time.Second)
	_, err := m.Acquire(ctx, request("b", 10*time.Second))
	var held *cluster.LeaseHeldError
	if !errors.As(err, &held) || held.Remaining != time.Second || !held.ExpiresAt.Equal(a.ExpiresAt) {
		t.Fatalf("Acquire 1s before expiry = %v, want a LeaseHeldError with 1s remaining", err)
	}
	a, err = m.Renew(ctx, a, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := start.Add(19 * time.Second); !a.ExpiresAt.Equal(want) {
		t.Fatalf("renewed ExpiresAt = %v, want %v: ttl from the renewal", a.ExpiresAt, want)
	}

	clock.Advance(10*time.Second - time.Nanosecond)
	mustHold(t, m, "a", 1)
	clock.Advance(time.Nanosecond)
	mustBeFree(t, m)
	if _, err := m.Renew(ctx, a, 10*time.Second); !errors.Is(err, cluster.ErrLeaseLost) {
		t.Fatalf("Renew at expiry = %v, want ErrLeaseLost", err)
	}
	if b := mustAcquire(t, m, request("b", 10*time.Second)); b.FencingToken != 2 {
		t.Fatalf("token after expiry = %d, want 2", b.FencingToken)
	}
}

// Expire ends the current term at once and keeps its token; it does
// nothing to a lease that no term holds.
func TestMemoryExpire(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m := providertest.NewMemory(providertest.NewClock(start).Now)
	m.Expire("leader") // never acquired
	mustBeFree(t, m)

	a := mustAcquire(t, m, request("a", time.Second))
	m.Expire("leader")
	mustBeFree(t, m)
	if _, err := m.Renew(ctx, a, time.Second); !errors.Is(err, cluster.ErrLeaseLost) {
		t.Fatalf("Renew after Expire = %v, want ErrLeaseLost", err)
	}
	m.Expire("leader") // already expired
	b := mustAcquire(t, m, request("b", time.Second))
	if b.FencingToken != a.FencingToken+1 {
		t.Fatalf("token after Expire = %d, want %d", b.FencingToken, a.FencingToken+1)
	}
	m.Expire("other")
	mustHold(t, m, "b", b.FencingToken)
}

// A disconnected node's calls fail and change nothing; other nodes, and
// Leader, are not affected; Reconnect heals it.
func TestMemoryDisconnect(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m := providertest.NewMemory(providertest.NewClock(start).Now)
	a := mustAcquire(t, m, request("a", time.Second))
	m.Disconnect("a")
	if _, err := m.Renew(ctx, a, time.Second); !errors.Is(err, providertest.ErrDisconnected) {
		t.Fatalf("Renew while disconnected = %v, want ErrDisconnected", err)
	}
	if err := m.Release(ctx, a); !errors.Is(err, providertest.ErrDisconnected) {
		t.Fatalf("Release while disconnected = %v, want ErrDisconnected", err)
	}
	mustHold(t, m, "a", a.FencingToken) // the release did not happen

	m.Expire("leader")
	if _, err := m.Acquire(ctx, request("a", time.Second)); !errors.Is(err, providertest.ErrDisconnected) {
		t.Fatalf("Acquire while disconnected = %v, want ErrDisconnected", err)
	}
	mustBeFree(t, m)
	b := mustAcquire(t, m, request("b", time.Second))

	m.Reconnect("a")
	if _, err := m.Acquire(ctx, request("a", time.Second)); !errors.Is(err, cluster.ErrLeaseHeld) {
		t.Fatalf("Acquire after Reconnect = %v, want ErrLeaseHeld", err)
	}
	mustHold(t, m, "b", b.FencingToken)
}

// A call on a done context fails with its error and changes nothing.
func TestMemoryContextDone(t *testing.T) {
	t.Parallel()
	m := providertest.NewMemory(providertest.NewClock(start).Now)
	a := mustAcquire(t, m, request("a", time.Second))
	done, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := m.Acquire(done, request("b", time.Second)); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire = %v, want context.Canceled", err)
	}
	if _, err := m.Renew(done, a, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("Renew = %v, want context.Canceled", err)
	}
	if err := m.Release(done, a); !errors.Is(err, context.Canceled) {
		t.Errorf("Release = %v, want context.Canceled", err)
	}
	if _, err := m.Leader(done, "leader"); !errors.Is(err, context.Canceled) {
		t.Errorf("Leader = %v, want context.Canceled", err)
	}
	mustHold(t, m, "a", a.FencingToken)
}

func TestMemoryRefusesNonPositiveTTL(t *testing.T) {
	t.Parallel()
	m := providertest.NewMemory(nil)
	if _, err := m.Acquire(t.Context(), request("a", 0)); err == nil {
		t.Fatal("Acquire with TTL 0 succeeded")
	}
	mustBeFree(t, m)
	a := mustAcquire(t, m, request("a", time.Minute))
	if _, err := m.Renew(t.Context(), a, -time.Second); err == nil || errors.Is(err, cluster.ErrLeaseLost) {
		t.Fatalf("Renew with a negative ttl = %v, want an error other than ErrLeaseLost", err)
	}
}

// Advancing the Clock past a leader's expiry ends its term at its next
// renew, as documented: lease-lost with ReasonLeaseTaken, and a lone node
// then takes a new term.
func TestClockAdvanceEndsTerm(t *testing.T) {
	t.Parallel()
	clock := providertest.NewClock(start)
	a := startNode(t, providertest.NewMemory(clock.Now), "a")
	if e := a.next(t, cluster.EventLeaseAcquired); e.FencingToken != 1 {
		t.Fatalf("first term's token = %d, want 1", e.FencingToken)
	}
	clock.Advance(leaseTTL)
	if e := a.next(t, cluster.EventLeaseLost); e.Reason != cluster.ReasonLeaseTaken || e.FencingToken != 1 {
		t.Fatalf("lease-lost event %+v, want reason %s for token 1", e, cluster.ReasonLeaseTaken)
	}
	if e := a.next(t, cluster.EventLeaseAcquired); e.FencingToken != 2 {
		t.Fatalf("next term's token = %d, want 2", e.FencingToken)
	}
}

// A leader cut off from the store ends its own term within FenceTimeout;
// once its lease is expired another node takes over, and the old leader
// follows when it is reconnected.
func TestDisconnectedLeaderIsReplaced(t *testing.T) {
	t.Parallel()
	store := providertest.NewMemory(providertest.NewClock(start).Now)
	a := startNode(t, store, "a")
	a.next(t, cluster.EventLeaseAcquired)
	b := startNode(t, store, "b")

	store.Disconnect("a")
	store.Expire("leader")
	if e := b.next(t, cluster.EventLeaseAcquired); e.FencingToken != 2 {
		t.Fatalf("b's token = %d, want 2", e.FencingToken)
	}
	if e := a.next(t, cluster.EventLeaseLost); e.Reason != cluster.ReasonSelfFenced {
		t.Fatalf("a's lease-lost event %+v, want reason %s", e, cluster.ReasonSelfFenced)
	}
	if a.IsLeader() || !b.IsLeader() {
		t.Fatalf("IsLeader: a %v, b %v; want only b", a.IsLeader(), b.IsLeader())
	}

	store.Reconnect("a")
	for {
		if e := a.next(t, cluster.EventLeaderChanged); e.LeaderID == "b" {
			break
		}
	}
	if a.IsLeader() {
		t.Fatal("a leads after reconnecting while b holds the lease")
	}
}
