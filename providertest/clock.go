package providertest

import (
	"sync"
	"time"
)

// A Clock is a clock that moves only when the test moves it, to give a
// [Memory] as its clock: NewMemory(clock.Now). Its methods are safe for
// concurrent use.
//
// Advancing it expires, in the Memory, every lease whose expiry it passes:
// Leader returns nil for it, and Acquire grants a new term. It moves no
// other clock and wakes nobody. A [cluster.Cluster] keeps its heartbeat
// and its trust window ([cluster.Config.FenceTimeout]) on the real
// monotonic clock, so its leader renews, and its followers try to
// acquire, at their usual moments; they find the change at their next
// attempt, within [cluster.Config.HeartbeatInterval] of real time. The
// leader's renew then fails with [cluster.ErrLeaseLost] and it reports a
// lease-lost event; see [Memory.Expire] for what happens until then.
//
// While the Clock stands still, no lease expires by itself, however long
// the test runs: a follower never takes the lease because a busy machine
// delayed the leader's renew past the TTL. (A leader whose renews all fail
// or stall for FenceTimeout still ends its own term, by the real clock,
// and releases the lease.)
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that reads start until it is advanced. The
// monotonic clock reading of start, if any, is dropped.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start.Round(0)}
}

// Now returns the Clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the Clock d forward. A negative d moves it back, as a
// stepped system clock would: leases then last longer.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
