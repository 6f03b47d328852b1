package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// laneBoard records which node works on which lane, through WorkLanes'
// fn, and fails the test if two fns ever work on one lane at once.
type laneBoard struct {
	t      *testing.T
	tg     testdb.Target
	mu     sync.Mutex
	active map[string]string // lane -> node
	errs   []error
	writes int
}

func newLaneBoard(t *testing.T, tg testdb.Target) *laneBoard {
	return &laneBoard{t: t, tg: tg, active: map[string]string{}}
}

// work is n's fn: it writes to the lane's log under the lane's token
// every 100ms until its context ends.
func (b *laneBoard) work(n *node) func(ctx context.Context, lane string, token uint64) error {
	return func(ctx context.Context, lane string, token uint64) error {
		b.mu.Lock()
		if other, ok := b.active[lane]; ok {
			b.errs = append(b.errs, fmt.Errorf("lane %s: %s started on it while %s worked on it", lane, n.NodeID(), other))
		}
		b.active[lane] = n.NodeID()
		b.mu.Unlock()
		defer func() {
			b.mu.Lock()
			delete(b.active, lane)
			b.mu.Unlock()
		}()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			got, err := laneWrite(ctx, n, b.tg.Dialect, b.tg.Prefix, lane)
			b.mu.Lock()
			switch {
			case err == nil && got != token:
				b.errs = append(b.errs, fmt.Errorf("lane %s: %s wrote under token %d inside fn for token %d", lane, n.NodeID(), got, token))
			case err == nil:
				b.writes++
			case ctx.Err() == nil && !expectedLaneRefusal(err):
				b.errs = append(b.errs, fmt.Errorf("lane %s: %s: %w", lane, n.NodeID(), err))
			}
			b.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
	}
}

// counts returns how many lanes each of nodes works on, and how many
// lanes are worked on.
func (b *laneBoard) counts(nodes ...*node) ([]int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	per := map[string]int{}
	for _, id := range b.active {
		per[id]++
	}
	var out []int
	for _, n := range nodes {
		out = append(out, per[n.NodeID()])
	}
	slices.Sort(out)
	return out, len(b.active)
}

func (b *laneBoard) check() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, err := range b.errs {
		b.t.Error(err)
	}
}

// runWorkLanes runs n.WorkLanes on a goroutine until the returned stop is
// called, which returns WorkLanes' error.
func runWorkLanes(t *testing.T, n *node, keys []string, fn func(context.Context, string, uint64) error) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.WorkLanes(ctx, keys, fn) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(shutdownBound):
				t.Fatalf("WorkLanes of %s did not return within %v of its context's end", n.NodeID(), shutdownBound)
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// WorkLanes spreads 4 lanes over 3 nodes as 2/1/1, keeps one worker per
// lane, writes under each lane's token, and spreads them again, 2/2, when
// a node leaves: on every dialect.
func TestWorkLanesSpreadsWithinOneOfEven(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		setup := tg.Open(t)
		createLaneLog(t, tg, setup)
		keys := []string{"k0", "k1", "k2", "k3"}
		board := newLaneBoard(t, tg)
		a, b, c := start(t, tg, "a"), start(t, tg, "b"), start(t, tg, "c")
		stops := map[*node]func() error{}
		for _, n := range []*node{a, b, c} {
			stops[n] = runWorkLanes(t, n, keys, board.work(n))
		}
		settled := func(want []int, nodes ...*node) func() bool {
			return func() bool {
				got, worked := board.counts(nodes...)
				return worked == len(keys) && slices.Equal(got, want)
			}
		}
		took := waitFor(t, 15*time.Second, "4 lanes over 3 nodes to settle 2/1/1", settled([]int{1, 1, 2}, a, b, c))
		// It stays so while nobody joins or leaves, unless a keeper's
		// renewal times out (SQLite's one writer, under the parallel
		// suite): the lane is then lost and claimed again, and the spread
		// must come back.
		moved := 0
		for range 10 {
			time.Sleep(testdb.Heartbeat)
			if got, worked := board.counts(a, b, c); worked != len(keys) || !slices.Equal(got, []int{1, 1, 2}) {
				moved++
			}
		}
		if moved > 0 {
			t.Logf("the spread moved in %d of 10 heartbeats after settling", moved)
			waitFor(t, 15*time.Second, "the spread to come back to 2/1/1", settled([]int{1, 1, 2}, a, b, c))
		}
		if err := stops[c](); !errors.Is(err, context.Canceled) {
			t.Fatalf("WorkLanes after its context ended = %v, want context.Canceled", err)
		}
		if err := c.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		again := waitFor(t, 15*time.Second, "4 lanes over the 2 nodes left to settle 2/2", settled([]int{2, 2}, a, b))
		t.Logf("settled 2/1/1 in %v, 2/2 in %v after c left (LeaseTTL %v, heartbeat %v)",
			took.Round(time.Millisecond), again.Round(time.Millisecond), testdb.LeaseTTL, testdb.Heartbeat)
		for _, n := range []*node{a, b} {
			stops[n]()
		}
		board.check()
		if board.writes == 0 {
			t.Fatal("no lane write succeeded")
		}
		readLaneLog(t, tg, setup) // tokens in order on every lane, one node per token
	})
}

// The context of a lane's fn is cancelled when the lane is lost (an
// operator ends the claim); when fn returns, by itself or after a loss,
// the lane is released and claimed again at a later heartbeat, with a new
// token. Shutdown waits for fn before it releases the lanes, and WorkLanes
// then returns ErrShutdown.
func TestWorkLanesLifecycle(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		type call struct {
			lane  string
			token uint64
		}
		calls := map[string]chan call{"quick": make(chan call, 16), "long": make(chan call, 16)}
		lost := make(chan call, 16)
		var mu sync.Mutex
		var returnedAt time.Time
		done := make(chan error, 1)
		go func() {
			done <- a.WorkLanes(ctx, []string{"quick", "long"}, func(ctx context.Context, lane string, token uint64) error {
				select {
				case calls[lane] <- call{lane, token}:
				default: // the quick lane comes back every heartbeat; the test reads two
				}
				if lane == "quick" {
					return errors.New("quick work fails at once") // logged; the lane is released
				}
				<-ctx.Done()
				lost <- call{lane, token}
				time.Sleep(3 * testdb.Heartbeat) // winding down: the lane stays a's meanwhile
				mu.Lock()
				returnedAt = time.Now()
				mu.Unlock()
				return nil
			})
		}()
		next := func(ch chan call, lane string) call {
			t.Helper()
			select {
			case c := <-ch:
				return c
			case <-time.After(10 * time.Second):
				t.Fatalf("no call for lane %s within 10s", lane)
				return call{}
			}
		}
		// A fn that returns has its lane released, and claimed again.
		q1 := next(calls["quick"], "quick")
		q2 := next(calls["quick"], "quick")
		if q2.token <= q1.token {
			t.Fatalf("quick lane claimed again with token %d after %d; want a new claim", q2.token, q1.token)
		}
		if e := a.events.wait(t, cluster.EventLaneReleased, time.Second); e.Reason != cluster.ReasonReleased {
			t.Fatalf("lane-released after fn returned = %+v, want reason %q", e, cluster.ReasonReleased)
		}

		// An operator ends the claim: fn's context is cancelled.
		l1 := next(calls["long"], "long")
		p, err := cluster.NewDBProvider(a.db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := p.ForceReleaseLane(ctx, "leader", "long", l1.token); err != nil || !ok {
			t.Fatalf("ForceReleaseLane = %v, %v", ok, err)
		}
		if got := next(lost, "long"); got != l1 {
			t.Fatalf("cancelled %+v, want %+v", got, l1)
		}
		l2 := next(calls["long"], "long")
		if l2.token <= l1.token {
			t.Fatalf("long lane claimed again with token %d after %d", l2.token, l1.token)
		}

		// Shutdown cancels fn and waits for it before releasing.
		if err := shutdownWithin(t, a.Cluster); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		mu.Lock()
		ret := returnedAt
		mu.Unlock()
		if ret.IsZero() || ret.After(released) {
			t.Fatalf("Shutdown returned at %v, fn at %v; want fn first", released, ret)
		}
		if err := <-done; !errors.Is(err, cluster.ErrShutdown) {
			t.Fatalf("WorkLanes after Shutdown = %v, want ErrShutdown", err)
		}
		lane, err := a.LaneOwner(ctx, "long")
		if err == nil && lane != nil && lane.Remaining > 0 {
			t.Fatalf("lane still held after Shutdown: %+v", lane)
		}
	})
}

// A lane whose work keeps failing is claimed again after a wait that
// doubles with each failure (one heartbeat, two, four, ...), not at every
// heartbeat.
func TestWorkLanesBacksOffFailingWork(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		a := start(t, tg, "a")
		var mu sync.Mutex
		var calls []time.Time
		stop := runWorkLanes(t, a, []string{"failing"}, func(ctx context.Context, lane string, token uint64) error {
			mu.Lock()
			calls = append(calls, time.Now())
			mu.Unlock()
			return errors.New("the downstream is down")
		})
		// Without the wait, fn would run about 24 times in 24 heartbeats;
		// with it, at about 0, 2, 5, 10 and 19 heartbeats.
		time.Sleep(24 * testdb.Heartbeat)
		if err := stop(); !errors.Is(err, context.Canceled) {
			t.Fatalf("WorkLanes = %v, want context.Canceled", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(calls) < 3 || len(calls) > 6 {
			t.Fatalf("failing work ran %d times in 24 heartbeats, want 3 to 6 (a doubling wait)", len(calls))
		}
		for i := 1; i < len(calls); i++ {
			// The wait after the i-th failure in a row is 2^(i-1)
			// heartbeats, from after the call began.
			if gap, want := calls[i].Sub(calls[i-1]), testdb.Heartbeat<<(i-1); gap < want {
				t.Fatalf("call %d came %v after the one before, want at least %v", i, gap, want)
			}
		}
	})
}

// Bad arguments are refused with ErrInvalidConfig, before any claim.
func TestWorkLanesBadInput(t *testing.T) {
	t.Parallel()
	c := startFake(t, &fakeProvider{})
	fn := func(context.Context, string, uint64) error { return nil }
	for _, tc := range []struct {
		name string
		keys []string
		fn   func(context.Context, string, uint64) error
	}{
		{"nil fn", []string{"k"}, nil},
		{"no keys", nil, fn},
		{"empty key", []string{"k", ""}, fn},
		{"repeated key", []string{"k", "j", "k"}, fn},
		{"control character", []string{"k\x00"}, fn},
	} {
		if err := c.WorkLanes(context.Background(), tc.keys, tc.fn); !errors.Is(err, cluster.ErrInvalidConfig) {
			t.Errorf("%s: WorkLanes = %v, want ErrInvalidConfig", tc.name, err)
		}
	}
	// A provider without lanes: an error that names the capability.
	if err := c.WorkLanes(context.Background(), []string{"k"}, fn); err == nil || !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Errorf("WorkLanes over a provider without lanes = %v, want ErrInvalidConfig", err)
	}
}

// In single-node mode the default instance owns every lane: fn runs for
// each key with token 0 until ctx ends.
func TestDefaultWorkLanesSingleNode(t *testing.T) {
	useDefault(t)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	got := map[string]uint64{}
	done := make(chan error, 1)
	go func() {
		done <- cluster.Default().WorkLanes(ctx, []string{"a", "b"}, func(ctx context.Context, lane string, token uint64) error {
			mu.Lock()
			got[lane] = token + 1
			mu.Unlock()
			<-ctx.Done()
			return nil
		})
	}()
	waitFor(t, time.Second, "fn to run for both lanes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 2
	})
	if got["a"] != 1 || got["b"] != 1 {
		t.Fatalf("tokens+1 = %v, want 1 (token 0) for each lane", got)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("WorkLanes = %v, want context.Canceled", err)
	}
}
