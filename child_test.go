//go:build unix

package cluster_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// Environment of a child node process.
const (
	envChild   = "CLUSTER_TEST_CHILD" // its node ID
	envDriver  = "CLUSTER_TEST_CHILD_DRIVER"
	envDSN     = "CLUSTER_TEST_CHILD_DSN"
	envPrefix  = "CLUSTER_TEST_CHILD_PREFIX"
	envDialect = "CLUSTER_TEST_CHILD_DIALECT"
)

// childMain runs one cluster node in this process and reports on stdout,
// one line each: "event <kind> <token> <reason>", "resumed leader=<bool>"
// after the process was stopped, "quiet" when writes are paused (SIGUSR1),
// "writing" when they resume (SIGUSR2), and "bye" after a clean Shutdown
// on SIGTERM.
// While it leads it appends fenced rows (seq, token, node) to <prefix>writes.
func childMain() int {
	id, prefix := os.Getenv(envChild), os.Getenv(envPrefix)
	dialect := cluster.Dialect(os.Getenv(envDialect))
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		fmt.Printf(format+"\n", args...)
		out.Unlock()
	}
	fail := func(err error) int {
		say("error %v", err)
		return 1
	}
	db, err := sql.Open(os.Getenv(envDriver), os.Getenv(envDSN))
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	ctx := context.Background()
	c, err := cluster.New(ctx, cluster.Config{
		NodeID:            id,
		DB:                db,
		TablePrefix:       prefix,
		LeaseTTL:          testdb.LeaseTTL,
		HeartbeatInterval: testdb.Heartbeat,
		FenceTimeout:      testdb.FenceTimeout,
		OnTransition: func(e cluster.Event) {
			say("event %s %d %s", e.Kind, e.FencingToken, e.Reason)
		},
	})
	if err != nil {
		return fail(err)
	}

	// Leader work reports when its term's context ends.
	wctx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var workDone sync.WaitGroup
	workDone.Go(func() {
		c.RunWhileLeader(wctx, func(ctx context.Context, token uint64) error {
			say("work-started %d", token)
			<-ctx.Done()
			say("work-stopped %d", token)
			return nil
		})
	})

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2)
	var writing atomic.Bool
	writing.Store(true)
	var writeMu sync.Mutex // held for the whole of each write transaction
	done := make(chan struct{})
	var wg sync.WaitGroup

	// The probe: a stop shows as a gap between iterations, and the first
	// IsLeader after it must already be false.
	wg.Go(func() {
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			before := time.Now()
			leader := c.IsLeader()
			if gap := time.Since(last); gap > 300*time.Millisecond {
				// The stop may have come after that sample (the goroutine
				// descheduled between it and the clock read above, on a
				// busy machine), which then predates the stop: sample
				// again, after the stop for certain. The first counts too
				// when the gap began before it.
				after := c.IsLeader()
				if before.Sub(last) > 300*time.Millisecond {
					after = after || leader
				}
				say("resumed leader=%v gap=%v", after, gap.Round(time.Millisecond))
			}
			last = time.Now()
		}
	})
	childLanes(ctx, c, db, dialect, prefix, say, done, &wg) // lanes_process_test.go
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			writeMu.Lock()
			if writing.Load() && c.IsLeader() {
				if err := fencedWrite(ctx, db, c.Fence, dialect, prefix, id); err != nil && !errors.Is(err, cluster.ErrStaleFencingToken) {
					say("write-error %v", err)
				}
			}
			writeMu.Unlock()
		}
	})

	for sig := range sigs {
		switch sig {
		case syscall.SIGUSR1:
			writing.Store(false)
			writeMu.Lock() // wait for a write in progress
			writeMu.Unlock()
			say("quiet")
		case syscall.SIGUSR2:
			writing.Store(true)
			say("writing")
		case syscall.SIGTERM:
			close(done)
			wg.Wait()
			stopWork()
			workDone.Wait()
			if err := c.Shutdown(ctx); err != nil {
				return fail(err)
			}
			say("bye")
			return 0
		}
	}
	return 0
}

// child is a node process seen from the test.
type child struct {
	id    string
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	more  chan struct{}
	exit  chan error
}

// spawn starts node id in a process of its own; env adds to its
// environment.
func spawn(t *testing.T, tg testdb.Target, id string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envChild+"="+id, envDriver+"="+tg.Driver, envDSN+"="+tg.DSN,
		envPrefix+"="+tg.Prefix, envDialect+"="+string(tg.Dialect))
	cmd.Env = append(cmd.Env, env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{id: id, cmd: cmd, more: make(chan struct{}, 1), exit: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.lines = append(c.lines, sc.Text())
			c.mu.Unlock()
			select {
			case c.more <- struct{}{}:
			default:
			}
		}
		c.exit <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.exit
		c.exit <- nil // for a later waiter
		for _, l := range c.output() {
			t.Logf("%s| %s", id, l)
		}
	})
	return c
}

func (c *child) output() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// has reports the first line starting with prefix.
func (c *child) has(prefix string) (string, bool) { return c.hasSince(prefix, 0) }

// hasSince reports the first line starting with prefix among the lines
// from the from-th on.
func (c *child) hasSince(prefix string, from int) (string, bool) {
	out := c.output()
	for _, l := range out[min(from, len(out)):] {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

func (c *child) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(s); err != nil {
		t.Fatalf("signal %v to %s: %v", s, c.id, err)
	}
}

// mark records how many lines each child has printed, for await.
func mark(cs ...*child) map[*child]int {
	m := map[*child]int{}
	for _, c := range cs {
		m[c] = len(c.output())
	}
	return m
}

// await waits for a line starting with prefix from any child of since,
// printed after since was marked, and returns the child and the line.
func await(t *testing.T, timeout time.Duration, prefix string, since map[*child]int) (*child, string) {
	t.Helper()
	var who *child
	var line string
	waitFor(t, timeout, fmt.Sprintf("%q from %d processes", prefix, len(since)), func() bool {
		for c, from := range since {
			if l, ok := c.hasSince(prefix, from); ok {
				who, line = c, l
				return true
			}
		}
		return false
	})
	return who, line
}
