package cluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// workLog records what leader work did, with monotonic timestamps, shared
// by the nodes of one test.
type workLog struct {
	mu      sync.Mutex
	entries []workEntry
}

type workEntry struct {
	node, what string
	token      uint64
	at         time.Time
}

func (l *workLog) add(node, what string, token uint64) {
	l.mu.Lock()
	l.entries = append(l.entries, workEntry{node, what, token, time.Now()})
	l.mu.Unlock()
}

func (l *workLog) find(node, what string) (workEntry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.entries {
		if e.node == node && e.what == what {
			return e, true
		}
	}
	return workEntry{}, false
}

// runWork runs leader work on n until the test ends: it logs start with the
// term's token, waits for its context, then takes linger to stop (as work
// finishing a batch would) and logs stop.
func runWork(t *testing.T, n *node, log *workLog, linger time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- n.RunWhileLeader(ctx, func(ctx context.Context, token uint64) error {
			log.add(n.NodeID(), "start", token)
			<-ctx.Done()
			time.Sleep(linger) // a sleep: work that takes linger to stop
			log.add(n.NodeID(), "stop", token)
			return ctx.Err()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) && !errors.Is(err, cluster.ErrShutdown) {
			t.Errorf("RunWhileLeader returned %v", err)
		}
	})
}
