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

// Nodes in separate processes: a leader stopped with SIGSTOP past its lease
// sees IsLeader false at once when it resumes, a leader killed with SIGKILL
// is replaced after the TTL, and the fenced writes of all of them commit in
// token order.
func TestMultiProcess(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		setup := tg.Open(t)
		createWriteLog(t, tg, setup)
		count := func(q string, args ...any) func() int64 {
			return func() int64 {
				var n int64
				if err := setup.QueryRow(bind(tg.Dialect, q), args...).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		wrote := func(ch *child) func() bool {
			rows := count("SELECT COUNT(*) FROM "+tg.Prefix+"writes WHERE node = ?", ch.id)
			return func() bool { return rows() > 0 }
		}
		termsWritten := count("SELECT COUNT(DISTINCT token) FROM " + tg.Prefix + "writes")
		a := spawn(t, tg, "a")
		await(t, 20*time.Second, "event lease-acquired", mark(a))
		b, c := spawn(t, tg, "b"), spawn(t, tg, "c")
		// b and c are up and see a lead, and a's term has written.
		await(t, 20*time.Second, "event leader-changed", map[*child]int{b: 0})
		await(t, 20*time.Second, "event leader-changed", map[*child]int{c: 0})
		waitFor(t, 5*time.Second, "a's writes", wrote(a))

		// Pause the leader past its lease, between two writes.
		m := mark(a)
		a.signal(t, syscall.SIGUSR1)
		await(t, 5*time.Second, "quiet", m)
		m = mark(a, b, c)
		// Stop it just after a renew, and not inside a write (its
		// membership refresh follows the renew): a process stopped while
		// it holds SQLite's write lock blocks every node until it resumes,
		// which is SQLite's nature, not what this test is about.
		afterRenew(t, tg, setup)
		stopOutsideWrite(t, tg, a)
		stopped := time.Now()
		second, _ := await(t, 10*time.Second, "event lease-acquired", mark(b, c))
		// Keep a stopped past its lease: a pause, not a wait for an event.
		time.Sleep(time.Until(stopped.Add(3 * testdb.LeaseTTL / 2)))
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
		m = mark(a)
		a.signal(t, syscall.SIGUSR2)
		await(t, 5*time.Second, "writing", m)
		waitFor(t, 5*time.Second, second.id+"'s writes", wrote(second))

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
		waitFor(t, 5*time.Second, "writes under a third term", func() bool { return termsWritten() >= 3 })

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

// stopOutsideWrite stops ch with SIGSTOP. On SQLite, while the file's
// write lock stays held for 30ms after the stop (ch stopped inside a write
// transaction), it resumes ch and stops it again a few milliseconds later.
func stopOutsideWrite(t *testing.T, tg testdb.Target, ch *child) {
	t.Helper()
	var probe *sql.DB
	if tg.Dialect == cluster.SQLite {
		file, _, _ := strings.Cut(tg.DSN, "?")
		probe = tg.OpenDSN(t, file+"?_pragma=busy_timeout(0)&_txlock=immediate")
	}
	held := func() bool {
		for i := 0; i < 4; i++ {
			if i > 0 {
				time.Sleep(10 * time.Millisecond)
			}
			tx, err := probe.Begin()
			var se interface{ Code() int }
			if errors.As(err, &se) && se.Code()&0xff == 5 {
				continue // SQLITE_BUSY: someone holds the write lock
			}
			if err != nil {
				t.Fatal(err)
			}
			tx.Rollback()
			return false
		}
		return true
	}
	for try := 0; ; try++ {
		ch.signal(t, syscall.SIGSTOP)
		if probe == nil || !held() {
			return
		}
		if try == 50 {
			t.Fatalf("%s held SQLite's write lock at each of 50 stops", ch.id)
		}
		t.Logf("%s: stop %d landed inside a write transaction; resumed it", ch.id, try+1)
		ch.signal(t, syscall.SIGCONT)
		time.Sleep(time.Duration(5+try%20) * time.Millisecond)
	}
}

// envLanes lists, comma-separated, the lanes a child node process works
// on, as a partitioned consumer does: it goes round the lanes it owns,
// writing one row to each lane's log in a transaction that begins with
// ClaimLane, tries the others every tenth round, and reports
// "lane-claimed <key> <token>" whenever it claims a lane anew.
const envLanes = "CLUSTER_TEST_CHILD_LANES"

// childLanes starts the child's lane worker, when envLanes is set; it
// stops when done closes.
func childLanes(ctx context.Context, c *cluster.Cluster, db *sql.DB, d cluster.Dialect, prefix string,
	say func(string, ...any), done <-chan struct{}, wg *sync.WaitGroup) {
	keys := os.Getenv(envLanes)
	if keys == "" {
		return
	}
	wg.Go(func() {
		tokens := map[string]uint64{}
		for round := 0; ; round++ {
			for _, k := range strings.Split(keys, ",") {
				select {
				case <-done:
					return
				default:
				}
				if round%10 != 0 && !c.OwnsLane(k) {
					continue
				}
				token, err := laneWriteOn(ctx, c, db, d, prefix, k)
				switch {
				case err == nil && token != tokens[k]:
					tokens[k] = token
					say("lane-claimed %s %d", k, token)
				case err != nil && !expectedLaneRefusal(err):
					say("lane-error %s %v", k, err)
				}
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
}

// Lane owners in separate processes: a process that owns a lane is killed
// with SIGKILL (it neither renews nor releases), and another process
// claims the lane once it expires by the database clock, with the next
// token; every lane's writes, from all the processes, commit in token
// order, one process per token.
func TestMultiProcessLanes(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		setup := tg.Open(t)
		createWriteLog(t, tg, setup)
		createLaneLog(t, tg, setup)
		lanes := envLanes + "=k1,k2"
		a := spawn(t, tg, "a", lanes)
		m := mark(a)
		await(t, 20*time.Second, "lane-claimed k1", m)
		await(t, 20*time.Second, "lane-claimed k2", m)
		b := spawn(t, tg, "b", lanes)
		// b takes its share: a hands one lane over (⌈2 lanes / 2 members⌉)
		// and keeps the other.
		_, line := await(t, 20*time.Second, "lane-claimed", mark(b))
		taken := strings.Fields(line)[1]

		// Kill a, which owns the other lane; b claims it once it expired.
		m = mark(b)
		a.signal(t, syscall.SIGKILL)
		killed := time.Now()
		var took time.Duration
		var claim string
		waitFor(t, 15*time.Second, "b to claim the killed process's lane", func() bool {
			for _, l := range b.output()[m[b]:] {
				if f := strings.Fields(l); len(f) == 3 && f[0] == "lane-claimed" && f[1] != taken {
					claim, took = l, time.Since(killed)
					return true
				}
			}
			return false
		})
		t.Logf("b: %q %v after a was killed (LeaseTTL 1s)", claim, took.Round(time.Millisecond))
		// a's keeper renewed the lane at most a heartbeat before the kill.
		if took < 800*time.Millisecond {
			t.Errorf("the lane was claimed %v after its owner was killed, before it could expire", took)
		}
		if f := strings.Fields(claim); f[2] == "1" {
			t.Errorf("b claimed a's lane with token 1: the token went back")
		}

		b.signal(t, syscall.SIGTERM)
		select {
		case err := <-b.exit:
			b.exit <- err
			if err != nil {
				t.Errorf("b exited: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("b did not exit on SIGTERM")
		}
		if _, ok := b.has("bye"); !ok {
			t.Error("b did not shut down cleanly")
		}
		for _, ch := range []*child{a, b} {
			if l, ok := ch.has("lane-error"); ok {
				t.Errorf("%s: %s", ch.id, l)
			}
		}
		byLane := map[string]map[string]bool{}
		for lane, log := range readLaneLog(t, tg, setup) { // token order on every lane
			byLane[lane] = map[string]bool{}
			for _, e := range log {
				byLane[lane][e.node] = true
			}
		}
		t.Logf("writers of each lane: %v", byLane)
		for _, k := range []string{"k1", "k2"} {
			if k != taken && !(byLane[k]["a"] && byLane[k]["b"]) {
				t.Fatalf("lane %s was not written by a and then b: %v", k, byLane)
			}
		}
	})
}

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
	// Events are reported by a goroutine of the process's, which drains
	// the channel when the process is done.
	events, stopEvents, eventsDone := make(chan cluster.Event, 64), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(eventsDone)
		for {
			select {
			case e := <-events:
				say("event %s %d %s", e.Kind, e.FencingToken, e.Reason)
			case <-stopEvents:
				for len(events) > 0 {
					e := <-events
					say("event %s %d %s", e.Kind, e.FencingToken, e.Reason)
				}
				return
			}
		}
	}()
	defer func() { close(stopEvents); <-eventsDone }()
	c, err := cluster.New(ctx, cluster.Config{
		NodeID:            id,
		DB:                db,
		TablePrefix:       prefix,
		LeaseTTL:          testdb.LeaseTTL,
		HeartbeatInterval: testdb.Heartbeat,
		FenceTimeout:      testdb.FenceTimeout,
		Events:            events,
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
