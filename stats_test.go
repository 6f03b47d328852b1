package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// Stats and the Observer follow a node through a term, a fenced write, a
// takeover, a resign and a shutdown, on every dialect.
func TestStatsAndObserver(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		ops := &opLog{}
		a := start(t, tg, "a", func(c *cluster.Config) { c.Observer = ops.add })
		s := a.Stats()
		if !s.Leader || s.FencingToken != a.FencingToken() || s.Acquisitions != 1 || s.TermStart.IsZero() || s.LastContact < 0 {
			t.Fatalf("stats of a new leader: %+v", s)
		}
		afterRenew(t, tg, a.db)
		waitFor(t, time.Second, "a renew observed", func() bool { return ops.count(cluster.OpRenew, cluster.OutcomeOK) > 0 })
		if s := a.Stats(); s.LastRenewLatency <= 0 || s.ConsecutiveRenewFailures != 0 {
			t.Fatalf("stats after a renew: %+v", s)
		}
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Fence(ctx, tx); err != nil {
			t.Fatal(err)
		}
		tx.Rollback()
		if ops.count(cluster.OpAcquire, cluster.OutcomeOK) != 1 || ops.count(cluster.OpFence, cluster.OutcomeOK) != 1 {
			t.Fatalf("observed %+v", ops.ops)
		}

		// A takeover behind a's back: its next renew is lost.
		b := start(t, tg, "b", slowRenew)
		expireLease(t, tg, a.db)
		a.events.wait(t, cluster.EventLeaseLost, 2*time.Second)
		// a may have taken the lease straight back (b polls slowly): only
		// the loss is certain.
		if s := a.Stats(); s.LossesTaken+s.SelfFences != 1 {
			t.Fatalf("stats after losing the lease: %+v", s)
		}
		waitFor(t, 2*time.Second, "the renew observed as lost", func() bool { return ops.count(cluster.OpRenew, cluster.OutcomeLost) > 0 })
		_ = b
		// Resign and Shutdown count releases.
		b.Shutdown(ctx)
		waitFor(t, 2*time.Second, "a to lead again", a.IsLeader)
		if err := a.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if s := a.Stats(); s.Resigns != 1 || s.Releases != 1 || s.Acquisitions != 2 {
			t.Fatalf("stats after a resign: %+v", s)
		}
		if ops.count(cluster.OpRelease, cluster.OutcomeOK) < 1 {
			t.Fatal("the release was not observed")
		}
	})
}

// An observed acquire refused because another node leads has the outcome
// "held"; one that fails is "error", with the error.
func TestObserverOutcomes(t *testing.T) {
	t.Parallel()
	var calls int
	boom := errors.New("database unreachable")
	p := &fakeProvider{AcquireFunc: func(context.Context, provider.LeaseRequest) (provider.Lease, error) {
		calls++
		if calls == 1 {
			return provider.Lease{}, &cluster.LeaseHeldError{Holder: "x", FencingToken: 7, Remaining: time.Second}
		}
		return provider.Lease{}, boom
	}}
	ops := &opLog{}
	cfg := fakeConfig(t, "a", p)
	cfg.Observer = ops.add
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	waitFor(t, 2*time.Second, "a failed acquire", func() bool { return ops.count(cluster.OpAcquire, cluster.OutcomeError) > 0 })
	if ops.count(cluster.OpAcquire, cluster.OutcomeHeld) != 1 {
		t.Fatalf("observed %+v", ops.ops)
	}
	ops.mu.Lock()
	defer ops.mu.Unlock()
	for _, o := range ops.ops {
		if o.Outcome == cluster.OutcomeError && !errors.Is(o.Err, boom) {
			t.Fatalf("error outcome carries %v", o.Err)
		}
	}
}

// Observe adds observers after New, beside Config.Observer; one added to
// the default instance before Init sees the member's first acquisition.
func TestObserve(t *testing.T) {
	t.Run("member", func(t *testing.T) {
		t.Parallel()
		var first, later opLog
		cfg := fakeConfig(t, "a", &fakeProvider{})
		cfg.Observer = first.add
		c, err := cluster.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Shutdown(context.Background()) })
		c.Observe(later.add)
		c.Observe(nil)
		waitFor(t, 2*time.Second, "renewals seen by the observer added after New", func() bool {
			return later.count(cluster.OpRenew, cluster.OutcomeOK) >= 2
		})
		if later.count(cluster.OpAcquire, cluster.OutcomeOK) != 0 {
			t.Error("an observer added after New saw New's acquisition")
		}
		if first.count(cluster.OpAcquire, cluster.OutcomeOK) != 1 || first.count(cluster.OpRenew, cluster.OutcomeOK) < 2 {
			t.Error("Config.Observer stopped seeing the calls once another was added")
		}
	})
	t.Run("default before Init", func(t *testing.T) {
		useDefault(t)
		var ops opLog
		cluster.Default().Observe(ops.add)
		if err := cluster.Init(context.Background(), fakeConfig(t, "n1", leaderProvider())); err != nil {
			t.Fatal(err)
		}
		if n := ops.count(cluster.OpAcquire, cluster.OutcomeOK); n != 1 {
			t.Fatalf("the observer added before Init saw %d acquisitions, want 1", n)
		}
		if cluster.Default().LeaseName() != cluster.DefaultLeaseName {
			t.Fatalf("LeaseName = %q", cluster.Default().LeaseName())
		}
	})
}
