package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// A system is one leader-election implementation under test, with a fixed
// number of member slots run in this process. Each slot holds at most one
// member at a time; start puts a fresh one in it.
type system interface {
	name() string
	// size is the number of member slots.
	size() int
	// start starts a fresh member in slot, which must be empty.
	start(ctx context.Context, slot int) error
	// leads reports whether the member in slot believes it leads, by the
	// implementation's own check (IsLeader or its equivalent).
	leads(slot int) bool
	// release hands off the member in slot's term cleanly (Shutdown,
	// Resign, ReleaseOnCancel, Resign of etcd). It reports whether the
	// slot is empty afterwards.
	release(ctx context.Context, slot int) (emptied bool, err error)
	// crash stops the member in slot from renewing without releasing, as
	// a process that died would, and empties the slot.
	crash(ctx context.Context, slot int) error
	// stop ends the member in slot, whatever its state, and empties it.
	stop(ctx context.Context, slot int)
	// acquisitions reports every term a member began, with the local
	// time at which its own leadership check turned true.
	acquisitions() <-chan acquisition
	// close stops every member and releases what the system holds.
	close(ctx context.Context) error
}

// leaseRows is implemented by the systems whose lease lives in a database
// row (this package): the trials read it before and after a takeover.
type leaseRows interface {
	leaseRow(ctx context.Context) (leaseRow, error)
}

// leaseRow is the lease as the database records it; times are unix
// milliseconds by the database clock.
type leaseRow struct {
	Token      uint64
	AcquiredAt int64
	ExpiresAt  int64
}

type acquisition struct {
	slot int
	at   time.Time
}

// slots is how many members each system runs in the side-by-side trials.
const slots = 3

// trialKind says how a trial ends the leader's term.
type trialKind string

const (
	handoff  trialKind = "handoff"  // a clean release
	takeover trialKind = "takeover" // a crash: no release, the lease expires
)

// trial is one handoff or takeover.
type trial struct {
	// Ms runs from the release or crash call to the moment another member's
	// own leadership check turned true.
	Ms float64 `json:"ms"`
	// PhaseMs is the random delay slept before the release, a fraction of
	// one retry period, so trials sample every phase of the followers'
	// retry cycle.
	PhaseMs float64 `json:"phaseMs"`
	// OvershootMs, for a takeover of a lease kept in a database row, is
	// the new term's acquired_at minus the crashed term's expires_at, both
	// read from the row by the database clock.
	OvershootMs *float64 `json:"overshootMs,omitempty"`
	// Stalls, with scale -probe, is what else was slow during the trial.
	Stalls *trialStalls `json:"stalls,omitempty"`

	from, to time.Time // the release or crash call, and the new term's start
}

// trialStalls is the slowest of each thing scale -probe watches over one
// trial's interval, in milliseconds: the probe process's statements
// (ProbeMs["pgbouncer"], ProbeMs["direct"]) and its 1ms sleeps' lateness
// (ProbeMs["sleep"]), and the bench process's own longest scheduling
// latency and GC pause (histogram bucket upper bounds).
type trialStalls struct {
	ProbeMs   map[string]float64 `json:"probeMs,omitempty"`
	SchedMs   float64            `json:"benchSchedMs"`
	GCPauseMs float64            `json:"benchGCPauseMs"`
}

// trialOptions are the knobs shared by every system's trials.
type trialOptions struct {
	trials int
	retry  time.Duration // the followers' retry period: the phase is drawn from [0, retry)
	settle time.Duration // wait after a leader emerges, so followers observe it
	limit  time.Duration // longest wait for a new leader
	rng    *rand.Rand
	log    func(format string, args ...any)
	// around, if set, is called as each trial starts; the function it
	// returns is called with the trial once the new leader is known.
	around func() func(*trial)
}

// runTrials runs opts.trials trials of kind on a system whose members
// are started, each from a settled leader.
func runTrials(ctx context.Context, sys system, kind trialKind, opts trialOptions) ([]trial, error) {
	rows, _ := sys.(leaseRows)
	var out []trial
	for skipped := 0; len(out) < opts.trials; {
		n := len(out)
		leader, err := waitLeader(ctx, sys, opts.limit)
		if err != nil {
			return out, fmt.Errorf("%s: trial %d: %w", sys.name(), n, err)
		}
		// Let followers observe the term and fall into their retry cycle,
		// then release at a random phase of it.
		if err := sleep(ctx, opts.settle); err != nil {
			return out, err
		}
		if !sys.leads(leader) {
			// Lost while settling (a stall on a busy machine): not a trial.
			if skipped++; skipped > opts.trials {
				return out, fmt.Errorf("%s: the leader changed while settling %d times", sys.name(), skipped)
			}
			continue
		}
		phase := time.Duration(opts.rng.Int64N(int64(opts.retry)))
		if err := sleep(ctx, phase); err != nil {
			return out, err
		}
		drain(sys.acquisitions())

		t := trial{PhaseMs: ms(phase)}
		var finish func(*trial)
		if opts.around != nil {
			finish = opts.around()
		}
		start := time.Now()
		var before leaseRow
		emptied := true
		switch kind {
		case handoff:
			emptied, err = sys.release(ctx, leader)
		case takeover:
			err = sys.crash(ctx, leader)
			if err == nil && rows != nil {
				// Read after the crash: nothing renews the row any more,
				// and no one can take it before it expires.
				before, err = rows.leaseRow(ctx)
			}
		}
		if err != nil {
			return out, fmt.Errorf("%s: trial %d: %s of member %d: %w", sys.name(), n, kind, leader, err)
		}
		a, err := nextLeader(ctx, sys, leader, start, opts.limit)
		if err != nil {
			return out, fmt.Errorf("%s: trial %d (%s): %w", sys.name(), n, kind, err)
		}
		t.Ms = ms(a.at.Sub(start))
		t.from, t.to = start, a.at
		if finish != nil {
			finish(&t)
		}
		if kind == takeover && rows != nil {
			after, err := rows.leaseRow(ctx)
			if err != nil {
				return out, fmt.Errorf("%s: trial %d: read lease row: %w", sys.name(), n, err)
			}
			if after.Token != before.Token+1 {
				return out, fmt.Errorf("%s: trial %d: lease token went from %d to %d; want one term between", sys.name(), n, before.Token, after.Token)
			}
			o := float64(after.AcquiredAt - before.ExpiresAt)
			t.OvershootMs = &o
		}
		out = append(out, t)
		if opts.log != nil {
			extra := ""
			if t.OvershootMs != nil {
				extra = fmt.Sprintf(" overshoot %.0fms", *t.OvershootMs)
			}
			if t.Stalls != nil {
				extra += fmt.Sprintf(" (bench: sched <= %.1fms, gc pause <= %.1fms)", t.Stalls.SchedMs, t.Stalls.GCPauseMs)
			}
			opts.log("%s %s %2d/%d: %7.1fms (phase %5.1fms, member %d -> %d)%s", sys.name(), kind, n+1, opts.trials, t.Ms, t.PhaseMs, leader, a.slot, extra)
		}
		if emptied {
			if err := sys.start(ctx, leader); err != nil {
				return out, fmt.Errorf("%s: restart member %d: %w", sys.name(), leader, err)
			}
		}
	}
	return out, nil
}

// waitLeader polls until exactly one member leads.
func waitLeader(ctx context.Context, sys system, limit time.Duration) (int, error) {
	deadline := time.Now().Add(limit)
	for {
		leader, count := -1, 0
		for slot := range sys.size() {
			if sys.leads(slot) {
				leader, count = slot, count+1
			}
		}
		if count == 1 {
			return leader, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("no single leader after %v (%d members lead)", limit, count)
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return -1, err
		}
	}
}

// nextLeader waits for a member other than old to begin a term at or
// after start.
func nextLeader(ctx context.Context, sys system, old int, start time.Time, limit time.Duration) (acquisition, error) {
	timeout := time.NewTimer(limit)
	defer timeout.Stop()
	for {
		select {
		case a := <-sys.acquisitions():
			if a.slot != old && !a.at.Before(start) {
				return a, nil
			}
		case <-timeout.C:
			return acquisition{}, fmt.Errorf("no other member led within %v", limit)
		case <-ctx.Done():
			return acquisition{}, ctx.Err()
		}
	}
}

func drain(ch <-chan acquisition) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// report sends an acquisition without blocking: the channel is drained
// before each trial and holds far more than one trial's events.
func report(ch chan acquisition, slot int, at time.Time) {
	select {
	case ch <- acquisition{slot: slot, at: at}:
	default:
	}
}

var errEmptySlot = errors.New("slot has no member")
