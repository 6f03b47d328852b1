package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// waitTimeout bounds every wait for a transition in these tests: with
// LeaseTTL 1s and heartbeats of 100ms, a takeover takes about a second.
const waitTimeout = 10 * time.Second

// startNode starts cluster node id on tg, with the test timings of
// testdb.Target.Config and a pool of its own, shut down when the test
// ends (before its pool is closed).
func startNode(t *testing.T, tg testdb.Target, id string, edit ...func(*cluster.Config)) *cluster.Cluster {
	t.Helper()
	cfg := tg.Config(t, tg.Open(t), id)
	for _, e := range edit {
		e(&cfg)
	}
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", id, err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	return c
}

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// soleLeader waits until exactly one of nodes believes it leads and
// returns it.
func soleLeader(t *testing.T, nodes ...*cluster.Cluster) *cluster.Cluster {
	t.Helper()
	var leader *cluster.Cluster
	waitFor(t, "one leader", func() bool {
		leader = nil
		for _, n := range nodes {
			if n.IsLeader() {
				if leader != nil {
					return false
				}
				leader = n
			}
		}
		return leader != nil
	})
	return leader
}

// leaderAbove waits until one of nodes leads with a fencing token above
// token and returns it.
func leaderAbove(t *testing.T, token uint64, nodes ...*cluster.Cluster) *cluster.Cluster {
	t.Helper()
	var leader *cluster.Cluster
	waitFor(t, fmt.Sprintf("a leader with a token above %d", token), func() bool {
		for _, n := range nodes {
			if n.IsLeader() && n.FencingToken() > token {
				leader = n
				return true
			}
		}
		return false
	})
	return leader
}
