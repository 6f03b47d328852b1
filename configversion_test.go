package cluster_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// configEvents returns the versions of the config-version-changed events
// a node received.
func configEvents(n *node) []uint64 {
	var out []uint64
	for _, e := range n.events.all() {
		if e.Kind == cluster.EventConfigVersionChanged {
			out = append(out, e.ConfigVersion)
		}
	}
	return out
}

// A bump on one node is seen by every other node within about a heartbeat
// (an event and the cached version), whether it reads the version in its
// lanes' heartbeat or on its own, and never by the bumping node as a
// change; bumps made at once from several nodes are never lost.
func TestConfigVersion(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		b := start(t, tg, "b") // reads the version in its lanes' heartbeat
		c := start(t, tg, "c") // reads it on its own
		if _, err := claimLane(ctx, b, "k"); err != nil {
			t.Fatal(err)
		}
		for _, n := range []*node{a, b, c} {
			if v, err := n.ConfigVersion(ctx); err != nil || v != 0 {
				t.Fatalf("%s: ConfigVersion = %d, %v; want 0", n.NodeID(), v, err)
			}
		}

		v, err := a.BumpConfigVersion(ctx)
		if err != nil || v != 1 {
			t.Fatalf("BumpConfigVersion = %d, %v; want 1", v, err)
		}
		if got := a.ConfigVersionCached(); got != 1 {
			t.Fatalf("the bumping node's cache = %d right after its bump, want 1", got)
		}
		bumped := time.Now()
		for _, n := range []*node{b, c} {
			e := n.events.wait(t, cluster.EventConfigVersionChanged, 5*time.Second)
			if e.ConfigVersion != 1 || n.ConfigVersionCached() != 1 {
				t.Fatalf("%s: event version %d, cached %d; want 1", n.NodeID(), e.ConfigVersion, n.ConfigVersionCached())
			}
			t.Logf("%s saw the bump %v after it (heartbeat 100ms)", n.NodeID(), time.Since(bumped).Round(time.Millisecond))
		}

		// Concurrent bumps: three nodes, five each.
		var mu sync.Mutex
		var got []uint64
		var wg sync.WaitGroup
		for _, n := range []*node{a, b, c} {
			for range 5 {
				wg.Go(func() {
					v, err := n.BumpConfigVersion(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					got = append(got, v)
					mu.Unlock()
				})
			}
		}
		wg.Wait()
		slices.Sort(got)
		if want := []uint64{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}; !slices.Equal(got, want) {
			t.Fatalf("concurrent bumps returned %v, want each of 2..16 once", got)
		}
		if v, err := c.ConfigVersion(ctx); err != nil || v != 16 {
			t.Fatalf("after 15 concurrent bumps the version is %d (%v), want 16", v, err)
		}
		for _, n := range []*node{a, b, c} {
			waitFor(t, 5*time.Second, n.NodeID()+" to cache version 16", func() bool { return n.ConfigVersionCached() == 16 })
			if vs := configEvents(n); !slices.IsSorted(vs) {
				t.Errorf("%s: config-version-changed events out of order: %v", n.NodeID(), vs)
			}
		}
		if vs := configEvents(a); slices.Contains(vs, 1) {
			t.Errorf("the bumping node saw its own bump as a change: %v", vs)
		}
	})
}

// A node that never asks for the config version reads nothing and emits
// no event; one that asked only for the cached version is told of bumps.
func TestConfigVersionIsOptIn(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.SQLite)
	ctx := context.Background()
	a := start(t, tg, "a")
	quiet := start(t, tg, "quiet")
	cached := start(t, tg, "cached")
	if got := cached.ConfigVersionCached(); got != 0 {
		t.Fatalf("ConfigVersionCached before any read = %d", got)
	}
	// The first bump may come before cached's first read, which then sees
	// it as where it starts; the second is a change either way.
	for v := uint64(1); v <= 2; v++ {
		if _, err := a.BumpConfigVersion(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "cached to see the bump", func() bool { return cached.ConfigVersionCached() == v })
	}
	if e := cached.events.wait(t, cluster.EventConfigVersionChanged, 5*time.Second); e.ConfigVersion == 0 {
		t.Fatalf("event %+v carries no version", e)
	}
	if vs := configEvents(quiet); len(vs) != 0 {
		t.Fatalf("a node that never asked got config events %v", vs)
	}
}
