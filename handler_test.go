package cluster_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// handlerShutdown is a transition handler that calls Shutdown on the first
// event it matches. Hand it its Cluster with give once New returns: an
// event emitted during New waits for it.
type handlerShutdown struct {
	match  func(cluster.Event) bool
	call   func(context.Context) error // what the handler calls; default the Cluster's Shutdown
	ready  chan *cluster.Cluster
	result chan error
	fired  atomic.Bool
}

func shutdownOn(match func(cluster.Event) bool) *handlerShutdown {
	return &handlerShutdown{match: match, ready: make(chan *cluster.Cluster, 1), result: make(chan error, 1)}
}

func shutdownOnKind(kind cluster.EventKind) *handlerShutdown {
	return shutdownOn(func(e cluster.Event) bool { return e.Kind == kind })
}

func (h *handlerShutdown) give(c *cluster.Cluster) { h.ready <- c }

func (h *handlerShutdown) handle(e cluster.Event) {
	if !h.match(e) || h.fired.Swap(true) {
		return
	}
	call := h.call
	if call == nil {
		call = (<-h.ready).Shutdown
	}
	h.result <- call(context.Background())
}

// wait fails the test unless the handler's Shutdown returned within the
// bound, and returns its result.
func (h *handlerShutdown) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-h.result:
		return err
	case <-time.After(shutdownBound):
		t.Fatalf("Shutdown called from a handler did not return within %v", shutdownBound)
		return nil
	}
}

// withHandler adds h after the handler the config already has.
func withHandler(h func(cluster.Event)) func(*cluster.Config) {
	return func(c *cluster.Config) {
		prev := c.OnTransition
		c.OnTransition = func(e cluster.Event) {
			if prev != nil {
				prev(e)
			}
			h(e)
		}
	}
}

// shutdownBound is how long a Shutdown may take in these tests: a release
// is bounded by one heartbeat (testdb.Heartbeat).
const shutdownBound = 3 * time.Second

// shutdownWithin calls Shutdown from the test and fails unless it returns
// within the bound. Called after a handler's Shutdown, it waits for the
// handlers' goroutine to exit, so goleak finds nothing left.
func shutdownWithin(t *testing.T, c *cluster.Cluster) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownBound)
	defer cancel()
	return c.Shutdown(ctx)
}

// shutdownWithinDefault is shutdownWithin for the default instance.
func shutdownWithinDefault(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownBound)
	defer cancel()
	return cluster.Shutdown(ctx)
}
