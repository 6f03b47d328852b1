package cluster

import (
	"errors"
	"math/bits"
	"sync/atomic"
	"time"
)

// OpKind names a provider call a Cluster makes.
type OpKind string

// The provider calls reported to [Config.Observer].
const (
	OpAcquire OpKind = "acquire"
	OpRenew   OpKind = "renew"
	OpRelease OpKind = "release"
	OpFence   OpKind = "fence"
	// OpClaimLane is one [Cluster.ClaimLane] that reached the provider:
	// its read of the lane and its fair share, and the claim.
	OpClaimLane OpKind = "claim-lane"
	// OpRenewLanes is the lane keeper's renewal of this node's lanes, once
	// per heartbeat.
	OpRenewLanes OpKind = "renew-lanes"
	// OpReleaseLane releases one lane ([Cluster.ReleaseLane], or a lane
	// handed over above this node's share) or, in Shutdown, all of them.
	OpReleaseLane OpKind = "release-lane"
)

// An Outcome says how a provider call ended.
type Outcome string

// The outcomes of an [Operation].
const (
	OutcomeOK    Outcome = "ok"    // done: granted, renewed, released, fenced
	OutcomeHeld  Outcome = "held"  // acquire: another term holds the lease; claim-lane: another node holds the lane, or this NodeID's elder runs
	OutcomeLost  Outcome = "lost"  // renew: the term no longer holds the lease
	OutcomeStale Outcome = "stale" // fence: the token is not the current term's
	OutcomeLimit Outcome = "limit" // claim-lane: this node holds its share of the lanes (ErrLaneLimit)
	OutcomeError Outcome = "error" // anything else: the database did not answer, refused, ...
)

// An Operation is one provider call, as [Config.Observer] sees it.
type Operation struct {
	Kind     OpKind        // which call
	Outcome  Outcome       // how it ended
	Duration time.Duration // how long the call took, by the monotonic clock
	Err      error         // nil for OutcomeOK
}

// outcomeOf classifies the error a provider call returned.
func outcomeOf(kind OpKind, err error) Outcome {
	switch {
	case err == nil:
		return OutcomeOK
	case kind == OpAcquire && errors.Is(err, ErrLeaseHeld):
		return OutcomeHeld
	case kind == OpRenew && errors.Is(err, ErrLeaseLost):
		return OutcomeLost
	case kind == OpFence && errors.Is(err, ErrStaleFencingToken):
		return OutcomeStale
	case kind == OpClaimLane && (errors.Is(err, ErrLaneHeld) || errors.Is(err, ErrDuplicateNodeID)):
		return OutcomeHeld
	case kind == OpClaimLane && errors.Is(err, ErrLaneLimit):
		return OutcomeLimit
	}
	return OutcomeError
}

// record records a provider call that started at start (mono) and
// reports it to Config.Observer and the observers added by Observe.
func (c *Cluster) record(kind OpKind, start int64, err error) {
	d := time.Duration(mono() - start)
	o := outcomeOf(kind, err)
	lease := kind == OpAcquire || kind == OpRenew || kind == OpRelease || kind == OpFence
	if lease && o != OutcomeError && o != OutcomeStale {
		c.stats.lastContact.Store(mono()) // the database answered
	}
	if kind == OpRenew && o == OutcomeOK {
		c.stats.renewLatency.Store(int64(d))
	}
	c.stats.recent.add(o == OutcomeError)
	op := Operation{Kind: kind, Outcome: o, Duration: d, Err: err}
	if f := c.cfg.Observer; f != nil {
		f(op)
	}
	if fs := c.observers.Load(); fs != nil {
		for _, f := range *fs {
			f(op)
		}
	}
}

// Observe adds f to the functions called after every provider call this
// node makes, as [Config.Observer] is, from the next call on: for metrics
// wired after New (clusterprom.Register). f must return quickly and must
// not block. A nil f is ignored. The default instance's Observe before
// [Init] adds f to the member Init creates.
func (c *Cluster) Observe(f func(Operation)) {
	if f == nil {
		return
	}
	if c.isDefault() {
		stdObserve(f)
		return
	}
	c.observeMu.Lock()
	defer c.observeMu.Unlock()
	var fs []func(Operation)
	if old := c.observers.Load(); old != nil {
		fs = append(fs, *old...)
	}
	fs = append(fs, f)
	c.observers.Store(&fs)
}

// Stats is a snapshot of a node's leadership and its history, for metrics
// and health checks. [Cluster.Stats] reads it without I/O.
type Stats struct {
	Leader       bool      // IsLeader at the time of the call
	FencingToken uint64    // the token of the term this node leads in, or 0
	TermStart    time.Time // when this node's current term began (local wall clock), or zero
	// LastRenewLatency is how long the last successful renew took.
	LastRenewLatency time.Duration
	// ConsecutiveRenewFailures counts the failed renews of the current
	// term since the last successful one.
	ConsecutiveRenewFailures int
	// LastContact is how long ago the database last answered a lease
	// statement of this node (any answer but an error), or -1 if never.
	LastContact time.Duration
	// RecentCalls and RecentFailures count this node's last provider
	// calls (at most 32: lease statements, fences, lane claims and
	// renewals) and how many of them failed (OutcomeError: not a lease or
	// lane held elsewhere, a stale token or a lane limit, which are
	// answers). [Cluster.HealthHandler] is unhealthy while half of them
	// fail.
	RecentCalls, RecentFailures int
	// HearingReleases reports that this node hears lease releases made by
	// other processes at once (PostgreSQL LISTEN through clusterpgx's
	// providers), so as a follower it polls only when the lease is due to
	// expire; false means it polls every heartbeat.
	HearingReleases bool

	Acquisitions uint64 // terms this node began
	LossesTaken  uint64 // terms that ended because another term took the lease (lease-lost, lease-taken)
	SelfFences   uint64 // terms that ended because no renew succeeded in time (lease-lost, self-fenced)
	Resigns      uint64 // terms ended by Resign
	Releases     uint64 // terms released by Shutdown or Resign

	// LanesHeld counts the lanes this node believes it owns, as
	// [Cluster.Lanes] lists them.
	LanesHeld        int
	LaneAcquisitions uint64 // lane-acquired events: claims this node began
	LaneLosses       uint64 // lane-lost events: lanes lost without releasing them
	LaneReleases     uint64 // lane-released events: lanes released, handed over, or released by Shutdown

	// EventsDropped counts the events not sent to a channel given to
	// [Cluster.Notify] or [Config.Events] because it was full.
	EventsDropped uint64
}

// stats are the counters behind Stats, updated as things happen.
type stats struct {
	termStart     atomic.Int64 // unix ns of the current term's start, 0 when none
	renewLatency  atomic.Int64 // ns
	renewFailures atomic.Int64
	lastContact   atomic.Int64 // mono, 0 when never
	recent        outcomes     // the last provider calls, failed or not

	acquisitions, lossesTaken, selfFences, resigns, releases atomic.Uint64
	laneAcquisitions, laneLosses, laneReleases               atomic.Uint64
}

// outcomes remembers whether each of the last recentCalls provider calls
// failed (OutcomeError), in one word: bit i is the call i calls ago.
// Losing a race to another caller only drops one call from the window.
type outcomes struct {
	bits  atomic.Uint64
	calls atomic.Uint64 // calls recorded, capped at recentCalls
}

const recentCalls = 32

func (o *outcomes) add(failed bool) {
	var bit uint64
	if failed {
		bit = 1
	}
	for {
		old := o.bits.Load()
		if o.bits.CompareAndSwap(old, old<<1|bit) {
			break
		}
	}
	if o.calls.Load() < recentCalls {
		o.calls.Add(1)
	}
}

// failing returns how many of the last calls (at most recentCalls) failed.
func (o *outcomes) failing() (failed, calls int) {
	calls = int(min(o.calls.Load(), recentCalls))
	return bits.OnesCount64(o.bits.Load() & (1<<calls - 1)), calls
}

// Stats returns a snapshot of this node's leadership and its counters. It
// does no I/O and takes no lock, so it is cheap enough for every scrape.
func (c *Cluster) Stats() Stats {
	if c.isDefault() {
		return stdStats()
	}
	t := c.liveTerm()
	s := Stats{
		LastRenewLatency:         time.Duration(c.stats.renewLatency.Load()),
		ConsecutiveRenewFailures: int(c.stats.renewFailures.Load()),
		LastContact:              -1,
		HearingReleases:          c.hearing.Load(),
		Acquisitions:             c.stats.acquisitions.Load(),
		LossesTaken:              c.stats.lossesTaken.Load(),
		SelfFences:               c.stats.selfFences.Load(),
		Resigns:                  c.stats.resigns.Load(),
		Releases:                 c.stats.releases.Load(),
		LanesHeld:                c.lanesHeld(),
		LaneAcquisitions:         c.stats.laneAcquisitions.Load(),
		LaneLosses:               c.stats.laneLosses.Load(),
		LaneReleases:             c.stats.laneReleases.Load(),
		EventsDropped:            c.events.dropped.Load(),
	}
	if t != nil {
		s.Leader, s.FencingToken = true, t.lease.FencingToken
		if ns := c.stats.termStart.Load(); ns != 0 {
			s.TermStart = time.Unix(0, ns)
		}
	}
	if at := c.stats.lastContact.Load(); at != 0 {
		s.LastContact = time.Duration(mono() - at)
	}
	s.RecentFailures, s.RecentCalls = c.stats.recent.failing()
	return s
}
