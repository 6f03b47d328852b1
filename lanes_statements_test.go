package cluster_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster/internal/testdb"
)

// What lanes and the config version add to a node's steady-state load:
// three followers of one leader, one plain, one that holds two lanes (and
// reads the config version in its lanes' heartbeat), one that only
// watches the config version. BENCHMARKS.md quotes the figures this logs:
//
//	go test -run TestLaneStatements -v .
func TestLaneStatements(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		var plainN, lanesN, configN atomic.Int64
		leader := start(t, tg, "leader")
		startOn(t, tg, openCounting(t, tg, &plainN), "plain")
		lanes := startOn(t, tg, openCounting(t, tg, &lanesN), "lanes")
		config := startOn(t, tg, openCounting(t, tg, &configN), "config")
		if !leader.IsLeader() {
			t.Fatal("the first node does not lead")
		}
		for _, k := range []string{"k1", "k2"} {
			if _, err := claimLane(ctx, lanes, k); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := lanes.ConfigVersion(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := config.ConfigVersion(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // a few heartbeats: not a wait for a transition
		p0, l0, c0 := plainN.Load(), lanesN.Load(), configN.Load()
		const beats = 30
		time.Sleep(beats * 100 * time.Millisecond) // counting over a fixed window
		p := float64(plainN.Load()-p0) / beats
		l := float64(lanesN.Load()-l0) / beats
		c := float64(configN.Load()-c0) / beats
		t.Logf("%s: statements per heartbeat: follower %.2f; with 2 lanes and the config version %.2f (+%.2f); watching the config version %.2f (+%.2f)",
			tg.Dialect, p, l, l-p, c, c-p)
		if !lanes.OwnsLane("k1") || !lanes.OwnsLane("k2") {
			t.Fatal("the lanes were not kept")
		}
		// Sanity bounds, generous for a loaded machine: lanes add at most
		// three statements per heartbeat, the config version one.
		if l-p > 3.6 || c-p > 1.6 {
			t.Errorf("more statements than the design allows: lanes +%.2f, config +%.2f per heartbeat", l-p, c-p)
		}
	})
}
