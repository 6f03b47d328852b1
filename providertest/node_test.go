package providertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/providertest"
)

// Timings of every node in these tests: the shortest the Config allows.
const (
	leaseTTL          = time.Second
	heartbeatInterval = 100 * time.Millisecond
	fenceTimeout      = 700 * time.Millisecond
	// eventTimeout bounds every wait for an event; only a failing test
	// waits that long.
	eventTimeout = 10 * time.Second
)

// start is a time far from the zero Time, for Clocks.
var start = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// node is a Cluster over a Memory, with its events on a channel.
type node struct {
	*cluster.Cluster
	events chan cluster.Event
}

// startNode starts node id over store; it is shut down when the test ends.
func startNode(t *testing.T, store *providertest.Memory, id string) *node {
	t.Helper()
	n := &node{events: make(chan cluster.Event, 256)}
	c, err := cluster.New(t.Context(), cluster.Config{
		NodeID:            id,
		Provider:          store,
		LeaseTTL:          leaseTTL,
		HeartbeatInterval: heartbeatInterval,
		FenceTimeout:      fenceTimeout,
		Logger:            testdb.Logger(t),
		Events:            n.events,
	})
	if err != nil {
		t.Fatalf("New(%s): %v", id, err)
	}
	n.Cluster = c
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	return n
}

// next returns the node's next event of kind, skipping the others.
func (n *node) next(t *testing.T, kind cluster.EventKind) cluster.Event {
	t.Helper()
	timeout := time.After(eventTimeout)
	for {
		select {
		case e := <-n.events:
			if e.Kind == kind {
				return e
			}
		case <-timeout:
			t.Fatalf("node %s: no %s event within %v", n.NodeID(), kind, eventTimeout)
		}
	}
}
