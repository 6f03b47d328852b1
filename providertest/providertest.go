package providertest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/provider"
)

// The TTLs the suite acquires with; see the package doc.
const (
	ttl      = time.Minute // long enough that nothing expires unless released
	shortTTL = time.Second // Expiry waits for this one
	// expiryMargin is added to the Remaining the store reports before the
	// suite treats the lease as expired: for the store's rounding, and for
	// its clock running a little slower than this process's.
	expiryMargin = 50 * time.Millisecond
)

// Run runs the conformance suite as subtests of t. Call it from a test in
// the implementation's own package.
//
// newStore is called once at the start of each subtest, with the
// subtest's t. Each call must prepare a fresh, empty store (no lease of
// any name ever granted in it) and return a func that opens a provider
// over that store. Each call of the returned func must give one more
// provider over the same store, as one more node would have: what one
// grants, the others see. Returning the same provider value each time is
// fine when it is safe for concurrent use, as the Provider contract
// requires. Use t.Cleanup in newStore to close what it opens.
//
// To skip a subtest, for a defect known and being fixed, call t.Skip in
// newStore when t.Name() ends in its name: the subtest has not touched
// the store yet. Say in the reason what is wrong.
func Run(t *testing.T, newStore func(t *testing.T) func() provider.Provider) {
	t.Run("AcquireFree", func(t *testing.T) {
		p := newStore(t)()
		l := acquire(t, p, req("a", ttl))
		if l.Name != "leader" || l.Holder != "a" || l.Instance != "a-instance" || l.Endpoint != "https://a" || l.FencingToken == 0 || l.ExpiresAt.IsZero() {
			t.Fatalf("lease = %+v, want name leader, holder a, instance a-instance, endpoint https://a, a nonzero token and an expiry", l)
		}
		mustLead(t, p, l)
	})

	t.Run("NoLeader", func(t *testing.T) {
		p := newStore(t)()
		mustBeFree(t, p, "leader")
	})

	t.Run("AcquireHeld", func(t *testing.T) {
		ctx := t.Context()
		open := newStore(t)
		a, b := open(), open()
		l := acquire(t, a, req("a", ttl))
		_, err := b.Acquire(ctx, req("b", ttl))
		mustBeHeld(t, err, l, ttl)
		// The holder asking again gets no second term either: a Cluster
		// reads its own instance in the error as a lost answer to an
		// acquisition that succeeded (or the provider gives that same
		// term back, as the default one does on PostgreSQL).
		again, err := a.Acquire(ctx, req("a", ttl))
		mustBeHeldOrSame(t, again, err, l, ttl)
		mustLead(t, b, l)
	})

	// LeaseRequest.Poll only lets a provider read before it attempts: the
	// answers are those of an attempt without it.
	t.Run("Poll", func(t *testing.T) {
		ctx := t.Context()
		open := newStore(t)
		a, b := open(), open()
		poll := func(holder string, d time.Duration) provider.LeaseRequest {
			r := req(holder, d)
			r.Poll = true
			return r
		}
		l := acquire(t, a, poll("a", ttl)) // free: granted
		_, err := b.Acquire(ctx, poll("b", ttl))
		mustBeHeld(t, err, l, ttl)
		again, err := a.Acquire(ctx, poll("a", ttl))
		mustBeHeldOrSame(t, again, err, l, ttl) // its own term: no second one either
		release(t, a, l)
		lb := acquire(t, b, poll("b", ttl)) // released: granted
		if lb.FencingToken <= l.FencingToken {
			t.Fatalf("token after a release = %d, want more than %d", lb.FencingToken, l.FencingToken)
		}
		mustLead(t, a, lb)
	})

	t.Run("Renew", func(t *testing.T) {
		ctx := t.Context()
		open := newStore(t)
		a, b := open(), open()
		l := acquire(t, a, req("a", ttl))
		// Renewing for twice the TTL shows, without waiting, that the new
		// expiry is counted from the renewal by ttl: the remaining time
		// exceeds what the first term could have had.
		r, err := a.Renew(ctx, l, 2*ttl)
		if err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if r.Name != l.Name || r.Holder != l.Holder || r.Instance != l.Instance || r.Endpoint != l.Endpoint || r.FencingToken != l.FencingToken {
			t.Fatalf("renewed lease %+v is not the term %+v", r, l)
		}
		if !r.ExpiresAt.After(l.ExpiresAt) {
			t.Fatalf("Renew for %v moved the expiry from %v to %v", 2*ttl, l.ExpiresAt, r.ExpiresAt)
		}
		_, err = b.Acquire(ctx, req("b", ttl))
		if held := mustBeHeld(t, err, r, 2*ttl); held.Remaining <= ttl {
			t.Fatalf("after Renew for %v, Remaining = %v; want more than the %v the term was acquired for", 2*ttl, held.Remaining, ttl)
		}
		mustLead(t, b, r)
	})

	t.Run("RenewMustMatchTerm", func(t *testing.T) {
		ctx := t.Context()
		p := newStore(t)()
		l := acquire(t, p, req("a", ttl))
		for _, c := range []struct {
			field string
			edit  func(*provider.Lease)
		}{
			{"name", func(l *provider.Lease) { l.Name = "other" }},
			{"holder", func(l *provider.Lease) { l.Holder = "b" }},
			{"instance", func(l *provider.Lease) { l.Instance = "a-other-instance" }},
			{"token", func(l *provider.Lease) { l.FencingToken++ }},
			{"older token", func(l *provider.Lease) { l.FencingToken-- }},
		} {
			wrong := l
			c.edit(&wrong)
			if _, err := p.Renew(ctx, wrong, 2*ttl); !errors.Is(err, cluster.ErrLeaseLost) {
				t.Errorf("Renew with another %s = %v, want ErrLeaseLost", c.field, err)
			}
		}
		mustLead(t, p, l) // unchanged, expiry included
		if _, err := p.Renew(ctx, l, ttl); err != nil {
			t.Fatalf("Renew of the real term after the failed ones: %v", err)
		}
	})

	t.Run("ReleaseThenAcquire", func(t *testing.T) {
		ctx := t.Context()
		open := newStore(t)
		a, b := open(), open()
		l := acquire(t, a, req("a", ttl))
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
		mustBeFree(t, a, "leader")
		if _, err := a.Renew(ctx, l, ttl); !errors.Is(err, cluster.ErrLeaseLost) {
			t.Fatalf("Renew after Release = %v, want ErrLeaseLost", err)
		}
		mustBeFree(t, b, "leader") // the failed renew did not bring it back
		rb := req("b", ttl)
		rb.Endpoint = ""
		lb := acquire(t, b, rb)
		if lb.FencingToken <= l.FencingToken {
			t.Fatalf("token after Release = %d, want more than the released term's %d", lb.FencingToken, l.FencingToken)
		}
		if lb.Endpoint != "" {
			t.Fatalf("lease of a node without an endpoint has endpoint %q, left from the released term?", lb.Endpoint)
		}
		mustLead(t, a, lb)
	})

	t.Run("ReleaseOldTerm", func(t *testing.T) {
		ctx := t.Context()
		open := newStore(t)
		a, b := open(), open()
		first := acquire(t, a, req("a", ttl))
		release(t, a, first)
		second := acquire(t, a, req("a", ttl)) // same holder, same instance
		if err := a.Release(ctx, first); err != nil {
			t.Fatalf("Release of an older term: %v", err)
		}
		mustLead(t, b, second)
		release(t, a, second)

		third := acquire(t, b, req("b", ttl))
		if err := a.Release(ctx, second); err != nil {
			t.Fatalf("Release of an older term after another node acquired: %v", err)
		}
		mustLead(t, a, third)
	})

	t.Run("ReleaseInstance", func(t *testing.T) {
		ctx := t.Context()
		p := newStore(t)()
		r, ok := p.(provider.InstanceReleaser)
		if !ok {
			t.Skip("the provider does not implement cluster.InstanceReleaser")
		}
		l := acquire(t, p, req("a", ttl))
		if err := r.ReleaseInstance(ctx, "leader", "a", "a-other-instance"); err != nil {
			t.Fatalf("ReleaseInstance of another instance: %v", err)
		}
		mustLead(t, p, l)
		if err := r.ReleaseInstance(ctx, "leader", l.Holder, l.Instance); err != nil {
			t.Fatalf("ReleaseInstance: %v", err)
		}
		mustBeFree(t, p, "leader")
		if err := r.ReleaseInstance(ctx, "leader", l.Holder, l.Instance); err != nil {
			t.Fatalf("ReleaseInstance of a lease not held: %v", err)
		}
	})

	t.Run("ReleaseTokenZeroIsNotSpecial", func(t *testing.T) {
		ctx := t.Context()
		p := newStore(t)()
		l := acquire(t, p, req("a", ttl))
		zero := l
		zero.FencingToken = 0
		if err := p.Release(ctx, zero); err != nil {
			t.Fatalf("Release with token 0: %v", err)
		}
		mustLead(t, p, l) // Release matches the token; 0 is no wildcard
	})

	t.Run("ReleaseByOtherIsNoop", func(t *testing.T) {
		ctx := t.Context()
		p := newStore(t)()
		l := acquire(t, p, req("a", ttl))
		for _, c := range []struct {
			field string
			edit  func(*provider.Lease)
		}{
			{"name", func(l *provider.Lease) { l.Name = "other" }},
			{"holder", func(l *provider.Lease) { l.Holder = "b" }},
			{"instance", func(l *provider.Lease) { l.Instance = "a-other-instance" }},
		} {
			wrong := l
			c.edit(&wrong)
			if err := p.Release(ctx, wrong); err != nil {
				t.Errorf("Release with another %s = %v, want nil", c.field, err)
			}
		}
		mustLead(t, p, l)
	})

	t.Run("ReleaseNotHeld", func(t *testing.T) {
		ctx := t.Context()
		p := newStore(t)()
		never := provider.Lease{Name: "leader", Holder: "a", Instance: "a-instance", FencingToken: 1}
		if err := p.Release(ctx, never); err != nil {
			t.Fatalf("Release of a lease never acquired: %v", err)
		}
		mustBeFree(t, p, "leader")
		l := acquire(t, p, req("a", ttl))
		release(t, p, l)
		if err := p.Release(ctx, l); err != nil {
			t.Fatalf("second Release of a term: %v", err)
		}
	})

	t.Run("TokensIncrease", func(t *testing.T) {
		open := newStore(t)
		nodes := []provider.Provider{open(), open()}
		var last uint64
		for i := range 20 {
			p := nodes[i%2]
			l := acquire(t, p, req(fmt.Sprintf("n%d", i%2), ttl))
			if l.FencingToken <= last {
				t.Fatalf("acquisition %d: token %d, want more than the previous %d", i+1, l.FencingToken, last)
			}
			last = l.FencingToken
			release(t, p, l)
		}
	})

	t.Run("Expiry", func(t *testing.T) {
		ctx := t.Context()
		open := newStore(t)
		a, b := open(), open()
		l := acquire(t, a, req("a", shortTTL))
		_, err := b.Acquire(ctx, req("b", shortTTL))
		held := mustBeHeld(t, err, l, shortTTL)
		// Remaining is by the store's clock, read after the acquisition:
		// once it has passed here, the term has expired there.
		time.Sleep(held.Remaining + expiryMargin)

		mustBeFree(t, b, "leader")
		if _, err := a.Renew(ctx, l, shortTTL); !errors.Is(err, cluster.ErrLeaseLost) {
			t.Fatalf("Renew of an expired term = %v, want ErrLeaseLost", err)
		}
		if _, err := a.Renew(ctx, l, shortTTL); !errors.Is(err, cluster.ErrLeaseLost) {
			t.Fatalf("second Renew of an expired term = %v, want ErrLeaseLost", err)
		}
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release of an expired term: %v", err)
		}
		mustBeFree(t, b, "leader")

		lb := acquire(t, b, req("b", ttl))
		if lb.FencingToken <= l.FencingToken {
			t.Fatalf("token after expiry = %d, want more than the expired term's %d", lb.FencingToken, l.FencingToken)
		}
		if _, err := a.Renew(ctx, l, shortTTL); !errors.Is(err, cluster.ErrLeaseLost) {
			t.Fatalf("Renew of an expired term after another node acquired = %v, want ErrLeaseLost", err)
		}
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release of an expired term after another node acquired: %v", err)
		}
		_, err = a.Acquire(ctx, req("a", shortTTL))
		mustBeHeld(t, err, lb, ttl)
	})

	t.Run("IndependentNames", func(t *testing.T) {
		p := newStore(t)()
		a := acquire(t, p, req("a", ttl))
		r := req("b", ttl)
		r.Name = "other"
		b := acquire(t, p, r)
		mustLead(t, p, a)
		mustLead(t, p, b)
		release(t, p, b)
		mustBeFree(t, p, "other")
		mustLead(t, p, a)
	})

	t.Run("ReleaseWakesWatchers", func(t *testing.T) {
		p := newStore(t)()
		w, ok := p.(provider.ReleaseWatcher)
		if !ok {
			t.Skipf("%T does not implement cluster.ReleaseWatcher", p)
		}
		woke := make(chan struct{}, 1)
		stop := w.WatchReleases(t.Context(), "leader", "b-instance", func() {
			select {
			case woke <- struct{}{}:
			default:
			}
		}, func(bool) {})
		defer stop()
		l := acquire(t, p, req("a", ttl))
		release(t, p, l)
		select {
		case <-woke:
		case <-time.After(5 * time.Second):
			t.Fatal("a release through the provider did not wake the watcher of another instance within 5s")
		}
		// Once stop has returned, wake is not called, whatever is released.
		stop()
		select {
		case <-woke: // a second wake of the release above (in process and by LISTEN)
		default:
		}
		next := acquire(t, p, req("c", ttl))
		release(t, p, next)
		time.Sleep(50 * time.Millisecond)
		select {
		case <-woke:
			t.Fatal("a release woke a watcher whose stop had returned")
		default:
		}
	})

	t.Run("ConcurrentAcquire", func(t *testing.T) {
		concurrentRounds(t, newStore(t), func(t *testing.T, winner provider.Lease, errs []error) {})
	})

	t.Run("ConcurrentAcquireReportsWinner", func(t *testing.T) {
		concurrentRounds(t, newStore(t), func(t *testing.T, winner provider.Lease, errs []error) {
			t.Helper()
			for _, err := range errs {
				if err != nil {
					mustBeHeld(t, err, winner, ttl)
				}
			}
		})
	})
}

// concurrentRounds has 8 providers over one store call Acquire at once, in
// three rounds, releasing the one term granted after each. It checks that
// exactly one term is granted each round, with a greater token than the
// round before, and that the others get ErrLeaseHeld; then it calls check
// with the winner's lease and every node's error (nil for the winner).
func concurrentRounds(t *testing.T, open func() provider.Provider, check func(t *testing.T, winner provider.Lease, errs []error)) {
	t.Helper()
	const n = 8
	providers := make([]provider.Provider, n)
	for i := range providers {
		providers[i] = open()
	}
	var last uint64
	for round := 1; round <= 3; round++ {
		var wg sync.WaitGroup
		start := make(chan struct{})
		leases := make([]provider.Lease, n)
		errs := make([]error, n)
		for i, p := range providers {
			wg.Go(func() {
				<-start
				leases[i], errs[i] = p.Acquire(t.Context(), req(fmt.Sprintf("n%d", i), ttl))
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: two terms granted: %+v and %+v", round, leases[winner], leases[i])
			case err == nil:
				winner = i
			case !errors.Is(err, cluster.ErrLeaseHeld):
				t.Fatalf("round %d: node n%d: %v, want ErrLeaseHeld", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: none of %d nodes acquired a free lease", round, n)
		}
		w := leases[winner]
		if w.FencingToken <= last {
			t.Fatalf("round %d: token %d, want more than the previous round's %d", round, w.FencingToken, last)
		}
		last = w.FencingToken
		check(t, w, errs)
		release(t, providers[(winner+1)%n], w) // any provider over the store may release a term it names
	}
}

// req is node holder's request for the lease "leader".
func req(holder string, ttl time.Duration) provider.LeaseRequest {
	return provider.LeaseRequest{Name: "leader", Holder: holder, Instance: holder + "-instance", Endpoint: "https://" + holder, TTL: ttl}
}

func acquire(t *testing.T, p provider.Provider, r provider.LeaseRequest) provider.Lease {
	t.Helper()
	l, err := p.Acquire(t.Context(), r)
	if err != nil {
		t.Fatalf("Acquire(%q) by %s: %v", r.Name, r.Holder, err)
	}
	return l
}

func release(t *testing.T, p provider.Provider, l provider.Lease) {
	t.Helper()
	if err := p.Release(t.Context(), l); err != nil {
		t.Fatalf("Release(%q) of %s's term %d: %v", l.Name, l.Holder, l.FencingToken, err)
	}
}

// mustBeHeldOrSame checks the answer to the holder of term l asking for
// the lease again: ErrLeaseHeld naming l, or l itself (its holder, instance
// and token), never a term of its own.
func mustBeHeldOrSame(t *testing.T, got provider.Lease, err error, l provider.Lease, ttl time.Duration) {
	t.Helper()
	if err != nil {
		mustBeHeld(t, err, l, ttl)
		return
	}
	if got.Holder != l.Holder || got.Instance != l.Instance || got.FencingToken != l.FencingToken {
		t.Fatalf("the holder asking again got holder %q (instance %q) with token %d, want ErrLeaseHeld or its own term, token %d",
			got.Holder, got.Instance, got.FencingToken, l.FencingToken)
	}
}

// mustBeHeld checks that err reports l as the term holding the lease, with
// at most ttl remaining.
func mustBeHeld(t *testing.T, err error, l provider.Lease, ttl time.Duration) *cluster.LeaseHeldError {
	t.Helper()
	var held *cluster.LeaseHeldError
	if !errors.As(err, &held) || !errors.Is(err, cluster.ErrLeaseHeld) {
		t.Fatalf("Acquire of a held lease = %v, want a *LeaseHeldError matching ErrLeaseHeld", err)
	}
	if held.Holder != l.Holder || held.Instance != l.Instance || held.Endpoint != l.Endpoint || held.FencingToken != l.FencingToken {
		t.Fatalf("held by %q (instance %q, endpoint %q, token %d), want %q (instance %q, endpoint %q, token %d)",
			held.Holder, held.Instance, held.Endpoint, held.FencingToken, l.Holder, l.Instance, l.Endpoint, l.FencingToken)
	}
	if !held.ExpiresAt.Equal(l.ExpiresAt) {
		t.Fatalf("LeaseHeldError.ExpiresAt = %v, want the term's %v", held.ExpiresAt, l.ExpiresAt)
	}
	// The store's clock is read by more than one statement, at
	// millisecond precision: allow it one millisecond of disagreement.
	if held.Remaining <= 0 || held.Remaining > ttl+time.Millisecond {
		t.Fatalf("LeaseHeldError.Remaining = %v, want within (0, %v]", held.Remaining, ttl)
	}
	return held
}

// mustLead checks that Leader reports l as the term holding its lease.
func mustLead(t *testing.T, p provider.Provider, l provider.Lease) {
	t.Helper()
	leader, err := p.Leader(t.Context(), l.Name)
	if err != nil {
		t.Fatalf("Leader(%q): %v", l.Name, err)
	}
	if leader == nil {
		t.Fatalf("Leader(%q) = nil, want %s's term %d", l.Name, l.Holder, l.FencingToken)
	}
	if leader.NodeID != l.Holder || leader.Endpoint != l.Endpoint || leader.FencingToken != l.FencingToken || !leader.LeaseExpiresAt.Equal(l.ExpiresAt) {
		t.Fatalf("Leader(%q) = %+v, want node %q, endpoint %q, token %d, expiry %v",
			l.Name, *leader, l.Holder, l.Endpoint, l.FencingToken, l.ExpiresAt)
	}
}

// mustBeFree checks that Leader reports nobody holding lease name.
func mustBeFree(t *testing.T, p provider.Provider, name string) {
	t.Helper()
	leader, err := p.Leader(t.Context(), name)
	if err != nil || leader != nil {
		t.Fatalf("Leader(%q) = %+v, %v; want nil, nil", name, leader, err)
	}
}
