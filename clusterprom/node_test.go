package clusterprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterprom"
	"github.com/sqlfence/cluster/providertest"
)

// Timings of every node in these tests: the shortest the Config allows.
const (
	leaseTTL          = time.Second
	heartbeatInterval = 100 * time.Millisecond
	fenceTimeout      = 700 * time.Millisecond
	// waitTimeout bounds every wait for a renew or an event; only a
	// failing test waits that long.
	waitTimeout = 10 * time.Second
)

// node is a Cluster over a Memory with its Metrics, watched, and signals
// of what it does.
type node struct {
	*cluster.Cluster
	metrics *clusterprom.Metrics
	events  chan cluster.Event
	renewed chan struct{} // a value after a successful renew; lossy
}

// startNode starts node id over store with its Metrics; it is shut down
// when the test ends.
func startNode(t *testing.T, store *providertest.Memory, id string) *node {
	t.Helper()
	n := &node{events: make(chan cluster.Event, 256), renewed: make(chan struct{}, 1)}
	cfg := cluster.Config{
		NodeID:            id,
		Provider:          store,
		LeaseTTL:          leaseTTL,
		HeartbeatInterval: heartbeatInterval,
		FenceTimeout:      fenceTimeout,
		Logger:            testLogger(t),
	}
	n.metrics = clusterprom.New(cfg)
	cfg.Observer = func(op cluster.Operation) {
		n.metrics.Observe(op)
		if op.Kind == cluster.OpRenew && op.Outcome == cluster.OutcomeOK {
			select {
			case n.renewed <- struct{}{}:
			default:
			}
		}
	}
	c, err := cluster.New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("cluster.New(%s): %v", id, err)
	}
	n.Cluster = c
	c.Notify(n.events)
	n.metrics.Watch(c)
	t.Cleanup(func() {
		if err := c.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown(%s): %v", id, err)
		}
	})
	return n
}

// waitRenew waits for the next successful renew of n.
func (n *node) waitRenew(t *testing.T) {
	t.Helper()
	select {
	case <-n.renewed:
	case <-time.After(waitTimeout):
		t.Fatalf("%s: no successful renew in %v", n.NodeID(), waitTimeout)
	}
}

// waitEvent waits for an event of n of the given kind, skipping others.
func (n *node) waitEvent(t *testing.T, kind cluster.EventKind) cluster.Event {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case e := <-n.events:
			if e.Kind == kind {
				return e
			}
		case <-deadline:
			t.Fatalf("%s: no %s event in %v", n.NodeID(), kind, waitTimeout)
		}
	}
}
