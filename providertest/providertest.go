// Package providertest is the conformance suite every [cluster.Provider]
// must pass. The default database provider runs it on every dialect; a
// third-party Provider runs it from a test of its own package.
package providertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// Run runs the suite as subtests of t. Each call of newStore must prepare
// a fresh, empty store and return a func that opens one more provider over
// that same store each time it is called: one more node.
func Run(t *testing.T, newStore func(t *testing.T) func() cluster.Provider) {
	ctx := context.Background()
	const ttl = time.Second

	req := func(holder string) cluster.LeaseRequest {
		return cluster.LeaseRequest{Name: "leader", Holder: holder, Instance: holder + "-instance", Endpoint: "https://" + holder, TTL: ttl}
	}
	acquire := func(t *testing.T, p cluster.Provider, holder string) cluster.Lease {
		t.Helper()
		l, err := p.Acquire(ctx, req(holder))
		if err != nil {
			t.Fatalf("Acquire(%s): %v", holder, err)
		}
		return l
	}
	mustHeld := func(t *testing.T, err error, holder string, token uint64) *cluster.LeaseHeldError {
		t.Helper()
		var held *cluster.LeaseHeldError
		if !errors.As(err, &held) || !errors.Is(err, cluster.ErrLeaseHeld) {
			t.Fatalf("got %v, want a *LeaseHeldError matching ErrLeaseHeld", err)
		}
		if held.Holder != holder || held.FencingToken != token {
			t.Fatalf("held by %q with token %d, want %q with %d", held.Holder, held.FencingToken, holder, token)
		}
		if held.Remaining <= 0 || held.Remaining > ttl {
			t.Fatalf("Remaining = %v, want in (0, %v]", held.Remaining, ttl)
		}
		return held
	}

	t.Run("AcquireFree", func(t *testing.T) {
		p := newStore(t)()
		l := acquire(t, p, "a")
		if l.FencingToken == 0 || l.Holder != "a" || l.Instance != "a-instance" || l.Name != "leader" || l.Endpoint != "https://a" {
			t.Fatalf("lease = %+v", l)
		}
		leader, err := p.Leader(ctx, "leader")
		if err != nil || leader == nil {
			t.Fatalf("Leader = %v, %v", leader, err)
		}
		if leader.NodeID != "a" || leader.FencingToken != l.FencingToken || leader.Endpoint != "https://a" {
			t.Fatalf("Leader = %+v, want holder a with token %d", leader, l.FencingToken)
		}
		if !leader.LeaseExpiresAt.Equal(l.ExpiresAt) {
			t.Fatalf("Leader expires %v, lease expires %v", leader.LeaseExpiresAt, l.ExpiresAt)
		}
	})

	t.Run("AcquireHeld", func(t *testing.T) {
		open := newStore(t)
		a, b := open(), open()
		l := acquire(t, a, "a")
		_, err := b.Acquire(ctx, req("b"))
		held := mustHeld(t, err, "a", l.FencingToken)
		if held.Instance != "a-instance" || held.Endpoint != "https://a" {
			t.Fatalf("held.Instance = %q, held.Endpoint = %q, want a-instance and https://a", held.Instance, held.Endpoint)
		}
		// The same node asking again does not get a second term either.
		_, err = a.Acquire(ctx, req("a"))
		mustHeld(t, err, "a", l.FencingToken)
	})

	t.Run("NoLeader", func(t *testing.T) {
		p := newStore(t)()
		leader, err := p.Leader(ctx, "leader")
		if err != nil || leader != nil {
			t.Fatalf("Leader on an empty store = %v, %v; want nil, nil", leader, err)
		}
	})

	t.Run("Renew", func(t *testing.T) {
		p := newStore(t)()
		l := acquire(t, p, "a")
		time.Sleep(20 * time.Millisecond)
		r, err := p.Renew(ctx, l, ttl)
		if err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if !r.ExpiresAt.After(l.ExpiresAt) || r.FencingToken != l.FencingToken {
			t.Fatalf("renewed lease %+v does not extend %+v with the same token", r, l)
		}
	})

	t.Run("RenewMustMatchTerm", func(t *testing.T) {
		p := newStore(t)()
		l := acquire(t, p, "a")
		for name, bad := range map[string]func(*cluster.Lease){
			"holder":   func(l *cluster.Lease) { l.Holder = "b" },
			"instance": func(l *cluster.Lease) { l.Instance = "other" },
			"token":    func(l *cluster.Lease) { l.FencingToken++ },
			"name":     func(l *cluster.Lease) { l.Name = "other" },
		} {
			wrong := l
			bad(&wrong)
			if _, err := p.Renew(ctx, wrong, ttl); !errors.Is(err, cluster.ErrLeaseLost) {
				t.Errorf("Renew with another %s = %v, want ErrLeaseLost", name, err)
			}
		}
		if _, err := p.Renew(ctx, l, ttl); err != nil {
			t.Fatalf("Renew of the real term after failed impostors: %v", err)
		}
	})

	t.Run("ReleaseThenAcquire", func(t *testing.T) {
		open := newStore(t)
		a, b := open(), open()
		l := acquire(t, a, "a")
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if leader, err := a.Leader(ctx, "leader"); err != nil || leader != nil {
			t.Fatalf("Leader after release = %v, %v; want nil", leader, err)
		}
		if _, err := a.Renew(ctx, l, ttl); !errors.Is(err, cluster.ErrLeaseLost) {
			t.Fatalf("Renew after release = %v, want ErrLeaseLost", err)
		}
		lb := acquire(t, b, "b")
		if lb.FencingToken <= l.FencingToken {
			t.Fatalf("token after release = %d, want more than %d", lb.FencingToken, l.FencingToken)
		}
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release of an old term: %v", err)
		}
		if leader, _ := a.Leader(ctx, "leader"); leader == nil || leader.NodeID != "b" {
			t.Fatalf("an old term's release ended the new term: leader = %+v", leader)
		}
	})

	t.Run("ReacquireIncrementsToken", func(t *testing.T) {
		p := newStore(t)()
		var last uint64
		for i := range 3 {
			l := acquire(t, p, "a")
			if l.FencingToken <= last {
				t.Fatalf("acquisition %d: token %d, want more than %d", i, l.FencingToken, last)
			}
			last = l.FencingToken
			if err := p.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("ReleaseAnyTermOfInstance", func(t *testing.T) {
		p := newStore(t)()
		l := acquire(t, p, "a")
		l.FencingToken = 0
		if err := p.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if leader, _ := p.Leader(ctx, "leader"); leader != nil {
			t.Fatalf("leader after releasing with token 0 = %+v", leader)
		}
	})

	t.Run("ReleaseByOtherIsNoop", func(t *testing.T) {
		p := newStore(t)()
		l := acquire(t, p, "a")
		other := l
		other.Instance = "intruder"
		if err := p.Release(ctx, other); err != nil {
			t.Fatal(err)
		}
		if leader, _ := p.Leader(ctx, "leader"); leader == nil || leader.FencingToken != l.FencingToken {
			t.Fatalf("another instance released our term: leader = %+v", leader)
		}
	})

	t.Run("Expiry", func(t *testing.T) {
		open := newStore(t)
		a, b := open(), open()
		l := acquire(t, a, "a")
		deadline := time.Now().Add(ttl + 2*time.Second)
		var lb cluster.Lease
		for {
			var err error
			lb, err = b.Acquire(ctx, req("b"))
			if err == nil {
				break
			}
			held := mustHeld(t, err, "a", l.FencingToken)
			if time.Now().After(deadline) {
				t.Fatalf("lease of TTL %v still held after %v", ttl, ttl+2*time.Second)
			}
			time.Sleep(held.Remaining + 5*time.Millisecond)
		}
		if lb.FencingToken != l.FencingToken+1 {
			t.Fatalf("token after expiry = %d, want %d", lb.FencingToken, l.FencingToken+1)
		}
		if _, err := a.Renew(ctx, l, ttl); !errors.Is(err, cluster.ErrLeaseLost) {
			t.Fatalf("Renew of an expired, taken term = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("IndependentNames", func(t *testing.T) {
		p := newStore(t)()
		a := acquire(t, p, "a")
		r := req("b")
		r.Name = "other"
		b, err := p.Acquire(ctx, r)
		if err != nil {
			t.Fatalf("Acquire of another name: %v", err)
		}
		if leader, _ := p.Leader(ctx, "leader"); leader == nil || leader.NodeID != "a" || leader.FencingToken != a.FencingToken {
			t.Fatalf("leader of %q = %+v", "leader", leader)
		}
		if leader, _ := p.Leader(ctx, "other"); leader == nil || leader.NodeID != "b" || leader.FencingToken != b.FencingToken {
			t.Fatalf("leader of %q = %+v", "other", leader)
		}
	})

	t.Run("ConcurrentAcquire", func(t *testing.T) {
		open := newStore(t)
		const n = 8
		providers := make([]cluster.Provider, n)
		for i := range providers {
			providers[i] = open()
		}
		for round := range 3 {
			var wg sync.WaitGroup
			leases := make([]cluster.Lease, n)
			errs := make([]error, n)
			for i, p := range providers {
				wg.Go(func() { leases[i], errs[i] = p.Acquire(ctx, req(fmt.Sprintf("n%d", i))) })
			}
			wg.Wait()
			var winner *cluster.Lease
			for i, err := range errs {
				switch {
				case err == nil && winner != nil:
					t.Fatalf("round %d: two winners: %+v and %+v", round, *winner, leases[i])
				case err == nil:
					winner = &leases[i]
				case !errors.Is(err, cluster.ErrLeaseHeld):
					t.Fatalf("round %d: node %d: %v", round, i, err)
				}
			}
			if winner == nil {
				t.Fatalf("round %d: nobody acquired a free lease", round)
			}
			if err := providers[0].Release(ctx, cluster.Lease{Name: "leader", Holder: winner.Holder, Instance: winner.Instance, FencingToken: winner.FencingToken}); err != nil {
				t.Fatal(err)
			}
		}
	})
}
