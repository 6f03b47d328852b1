package cluster_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// node is a cluster member under test with its own connection pool and a
// record of its transitions.
type node struct {
	*cluster.Cluster
	db     *sql.DB
	events *eventLog
}

// start starts a node with id on tg, shut down when the test ends.
func start(t *testing.T, tg testdb.Target, id string, edit ...func(*cluster.Config)) *node {
	t.Helper()
	db := tg.Open(t)
	return startOn(t, tg, db, id, edit...)
}

func startOn(t *testing.T, tg testdb.Target, db *sql.DB, id string, edit ...func(*cluster.Config)) *node {
	t.Helper()
	cfg := tg.Config(t, db, id)
	log := &eventLog{}
	cfg.OnTransition = log.add
	for _, e := range edit {
		e(&cfg)
	}
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", id, err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	return &node{Cluster: c, db: db, events: log}
}

// eventLog records transitions delivered to a handler.
type eventLog struct {
	mu     sync.Mutex
	events []cluster.Event
}

func (l *eventLog) add(e cluster.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) all() []cluster.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]cluster.Event(nil), l.events...)
}

// wait returns the first event of kind, waiting up to timeout for it.
func (l *eventLog) wait(t *testing.T, kind cluster.EventKind, timeout time.Duration) cluster.Event {
	t.Helper()
	var found cluster.Event
	waitFor(t, timeout, string(kind)+" event", func() bool {
		for _, e := range l.all() {
			if e.Kind == kind {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond) // the polling interval
	}
	return time.Since(start)
}

// leaderOf waits until exactly one of nodes leads and returns it.
func leaderOf(t *testing.T, timeout time.Duration, nodes ...*node) *node {
	t.Helper()
	var leader *node
	waitFor(t, timeout, "one leader", func() bool {
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

// watchSingleLeader samples the nodes until the test ends and fails it if
// two of them believe they lead at the same instant. A node counts as
// leading when two consecutive passes both see it lead; beliefs are
// intervals, so the instant between the passes had both.
func watchSingleLeader(t *testing.T, nodes ...*node) {
	t.Helper()
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		first := make([]bool, len(nodes))
		for !stop.Load() {
			for i, n := range nodes {
				first[i] = n.IsLeader()
			}
			var leaders []string
			for i, n := range nodes {
				if first[i] && n.IsLeader() {
					leaders = append(leaders, n.NodeID())
				}
			}
			if len(leaders) > 1 {
				t.Errorf("two leaders at once: %v", leaders)
				return
			}
			time.Sleep(100 * time.Microsecond) // the sampling interval
		}
	}()
	t.Cleanup(func() {
		stop.Store(true)
		<-done
	})
}
