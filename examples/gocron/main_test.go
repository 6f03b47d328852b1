package main

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// The job runs on the leader, in its term.
func TestJobRunsOnLeader(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var runs, token atomic.Uint64
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, "node-1", filepath.Join(t.TempDir(), "gocron.db"), 50*time.Millisecond, func(tok uint64) {
			token.Store(tok)
			runs.Add(1)
		})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for runs.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if runs.Load() < 2 || token.Load() == 0 {
		t.Fatalf("the job ran %d times with token %d on the leader, want at least 2 runs with a token", runs.Load(), token.Load())
	}
}
