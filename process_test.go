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
// after the process was stopped, "quiet" when writes are paused (SIGUSR1;
// SIGUSR2 resumes them), and "bye" after a clean Shutdown on SIGTERM.
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
		LeaseTTL:          time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		FenceTimeout:      700 * time.Millisecond,
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
			leader := c.IsLeader()
			if gap := time.Since(last); gap > 300*time.Millisecond {
				say("resumed leader=%v gap=%v", leader, gap.Round(time.Millisecond))
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

// mark records how many lines each child has printed, for await.
func mark(cs ...*child) map[*child]int {
	m := map[*child]int{}
	for _, c := range cs {
		m[c] = len(c.output())
	}
	return m
}

func (c *child) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(s); err != nil {
		t.Fatalf("signal %v to %s: %v", s, c.id, err)
	}
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

// Nodes in separate processes: a leader stopped with SIGSTOP past its lease
// sees IsLeader false at once when it resumes, a leader killed with SIGKILL
// is replaced after the TTL, and the fenced writes of all of them commit in
// token order.
func TestMultiProcess(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		setup := tg.Open(t)
		createWriteLog(t, tg, setup)
		a := spawn(t, tg, "a")
		await(t, 20*time.Second, "event lease-acquired", mark(a))
		b, c := spawn(t, tg, "b"), spawn(t, tg, "c")
		time.Sleep(500 * time.Millisecond)

		// Pause the leader past its lease, between two writes.
		m := mark(a)
		a.signal(t, syscall.SIGUSR1)
		await(t, 5*time.Second, "quiet", m)
		m = mark(a, b, c)
		// Stop it just after a renew, not during one: a process stopped
		// while it holds SQLite's write lock blocks every node until it
		// resumes, which is SQLite's nature, not what this test is about.
		afterRenew(t, tg, setup)
		a.signal(t, syscall.SIGSTOP)
		stopped := time.Now()
		second, _ := await(t, 10*time.Second, "event lease-acquired", mark(b, c))
		time.Sleep(time.Until(stopped.Add(1500 * time.Millisecond)))
		a.signal(t, syscall.SIGCONT)
		if _, l := await(t, 5*time.Second, "resumed", m); !strings.HasPrefix(l, "resumed leader=false") {
			t.Fatalf("a resumed after %v believing it led: %q", time.Since(stopped), l)
		}
		await(t, 5*time.Second, "event lease-lost", m)
		// Its leader work was told before it could lead again.
		await(t, 5*time.Second, "work-stopped", m)
		stoppedAt, acquiredAt := -1, -1
		for i, l := range a.output()[m[a]:] {
			if strings.HasPrefix(l, "work-stopped") && stoppedAt < 0 {
				stoppedAt = i
			}
			if strings.HasPrefix(l, "event lease-acquired") && acquiredAt < 0 {
				acquiredAt = i
			}
		}
		if acquiredAt >= 0 && acquiredAt < stoppedAt {
			t.Fatalf("a led again before its old term's work context was cancelled: %q", a.output()[m[a]:])
		}
		a.signal(t, syscall.SIGUSR2)
		time.Sleep(300 * time.Millisecond)

		// Kill the second leader outright; another process takes over once
		// its lease expires.
		third := b
		if second == b {
			third = c
		}
		m = mark(third, a)
		second.signal(t, syscall.SIGKILL)
		killed := time.Now()
		third, _ = await(t, 10*time.Second, "event lease-acquired", m)
		t.Logf("%s took over %v after SIGKILL", third.id, time.Since(killed).Round(time.Millisecond))
		time.Sleep(300 * time.Millisecond)

		survivors := []*child{a, b}
		if second == b {
			survivors = []*child{a, c}
		}
		for _, ch := range survivors {
			ch.signal(t, syscall.SIGTERM)
			select {
			case err := <-ch.exit:
				ch.exit <- err
				if err != nil {
					t.Errorf("%s exited: %v", ch.id, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not exit on SIGTERM", ch.id)
			}
			if _, ok := ch.has("bye"); !ok {
				t.Errorf("%s did not shut down cleanly", ch.id)
			}
			if l, ok := ch.has("error"); ok {
				t.Errorf("%s: %s", ch.id, l)
			}
		}

		writers := map[string]int{}
		terms := map[int64]string{}
		for _, w := range readWriteLog(t, tg, setup) {
			writers[w.node]++
			if n, ok := terms[w.token]; ok && n != w.node {
				t.Fatalf("token %d was used by %s and %s", w.token, n, w.node)
			}
			terms[w.token] = w.node
		}
		t.Logf("commits by node: %v; node of each term: %v", writers, terms)
		// Three terms wrote (the third may be a's again), each its own node's.
		if len(terms) < 3 || len(writers) < 2 {
			t.Fatalf("want commits under three terms from at least two processes, got terms %v", terms)
		}
	})
}
