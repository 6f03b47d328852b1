package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

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
