package cluster

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// The lease state machine. One goroutine (run) owns every transition:
//
//	follower --acquire--> leader --renew ok--> leader
//	leader --renew says lease is not ours--> follower   (lease-lost, lease-taken)
//	leader --no renew within FenceTimeout--> follower   (lease-lost, self-fenced)
//	leader --Resign--> follower, holding off            (lease-released, resigned)
//	any --Shutdown--> terminated                        (lease-released)
//
// Every node also reports each term it observes, its own included, and
// the lease becoming free (leader-changed).
//
// A leader's belief ends at the start of its last successful attempt plus
// FenceTimeout, on the monotonic clock. IsLeader compares against that
// deadline itself, so the belief ends on time even when this goroutine is
// late; the goroutine only makes the ending visible as an event.

// run is the heartbeat goroutine. wait is the delay before its first step.
func (c *Cluster) run(ctx context.Context, wait time.Duration) {
	defer c.wg.Done()
	defer c.heartbeating.Store(false)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-c.wake:
			// Another node released the lease. A leader has nothing to do;
			// a follower makes one attempt now. The row grants it to one of
			// the followers that try; the others are told who holds it and
			// until when, and sleep until then: one statement each per
			// release, however many hear it.
			if c.term.Load() != nil || c.retiring.Load() != nil {
				continue
			}
			c.pollNext = false // the lease is likely free: a full attempt
			timer.Stop()       // since Go 1.23 no stale tick can follow; Reset below rearms it
		}
		wait := c.step(ctx)
		if c.halted != nil {
			c.haltedFlag.Store(true)
			return
		}
		timer.Reset(wait)
		// After the lease statement, and on a goroutine of its own: the
		// renew goes first, and a slow refresh delays no later one.
		c.refreshMembership(ctx, true)
	}
}

// step makes one attempt to renew or acquire the lease and returns how long
// to wait before the next.
func (c *Cluster) step(ctx context.Context) time.Duration {
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	if t := c.term.Load(); t != nil {
		return c.renew(ctx, t)
	}
	if t := c.retiring.Load(); t != nil {
		if t.releasing {
			return c.cfg.HeartbeatInterval // Shutdown or Resign is releasing it
		}
		// Shutdown or Resign is waiting for leader work to stop: keep the
		// lease, so no other node starts that work meanwhile.
		start := mono()
		rctx, cancel := context.WithTimeout(ctx, c.cfg.HeartbeatInterval)
		_, err := c.provider.Renew(rctx, t.lease, c.cfg.LeaseTTL)
		c.record(OpRenew, start, err)
		if err != nil {
			c.log.DebugContext(ctx, "cluster: renew while leader work stops failed", "fencing_token", t.lease.FencingToken, "err", err)
		}
		cancel()
		return max(c.cfg.HeartbeatInterval-time.Duration(mono()-start), 0)
	}
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		return c.cfg.HeartbeatInterval
	}
	return c.campaign(ctx)
}

// renew extends the lease of term t. A failure other than a definite loss
// is retried promptly until the trust window ends.
func (c *Cluster) renew(ctx context.Context, t *term) time.Duration {
	start := mono()
	until := c.until.Load()
	if start >= until {
		return c.selfFence(ctx, t)
	}
	// The call must end before the window does, with time to spare for
	// acting on its outcome.
	left := time.Duration(until - start)
	rctx, cancel := context.WithTimeout(ctx, left-left/10)
	_, err := c.provider.Renew(rctx, t.lease, c.cfg.LeaseTTL)
	cancel()
	c.record(OpRenew, start, err)
	now := mono()
	switch {
	case err == nil && now < until && c.until.CompareAndSwap(until, monoAfter(start, c.cfg.FenceTimeout)):
		// The CAS fails when the term's timer ended the window meanwhile,
		// or Shutdown or Resign ended the term.
		t.timer.Reset(c.untilMargin(c.until.Load()))
		if c.renewFailures > 0 {
			c.log.InfoContext(ctx, "cluster: renew succeeded after failures", "fencing_token", t.lease.FencingToken, "failures", c.renewFailures)
			c.renewFailures = 0
			c.stats.renewFailures.Store(0)
		}
		return max(c.cfg.HeartbeatInterval-time.Duration(now-start), 0)
	case err == nil:
		// The renew returned after the window ended (a provider that ignores
		// ctx), or the term's timer ended it first. IsLeader was already
		// false; the term is over for us.
		return c.selfFence(ctx, t)
	case errors.Is(err, ErrLeaseLost):
		c.lose(t, ReasonLeaseTaken, err)
		return 0 // campaign now, to learn how long the new holder has
	case ctx.Err() != nil:
		return 0 // shutting down
	case now >= until:
		c.log.WarnContext(ctx, "cluster: renew failed", "fencing_token", t.lease.FencingToken, "err", err)
		return c.selfFence(ctx, t)
	default:
		// The first failure of a streak is a warning; the retries are noise.
		left := time.Duration(until - now)
		level := slog.LevelWarn
		if c.renewFailures > 0 {
			level = slog.LevelDebug
		}
		c.renewFailures++
		c.stats.renewFailures.Store(int64(c.renewFailures))
		c.log.Log(ctx, level, "cluster: renew failed; retrying while the trust window lasts",
			"fencing_token", t.lease.FencingToken, "window_left", left.Round(time.Millisecond), "err", err)
		return min(c.retryDelay(), left)
	}
}

// retryDelay is the pause between renew attempts after a failed one.
func (c *Cluster) retryDelay() time.Duration {
	return min(max(c.cfg.HeartbeatInterval/5, 20*time.Millisecond), time.Second)
}

// selfFence ends term t because its trust window closed without a
// successful renew, then expires the term in the store on a best-effort
// basis so that a follower need not wait out the TTL.
func (c *Cluster) selfFence(ctx context.Context, t *term) time.Duration {
	if !c.lose(t, ReasonSelfFenced, nil) {
		return 0
	}
	if err := c.release(ctx, t.lease); err != nil {
		c.log.DebugContext(ctx, "cluster: release after self-fencing failed; the lease expires by itself",
			"fencing_token", t.lease.FencingToken, "err", err)
		return c.cfg.HeartbeatInterval
	}
	c.observe(observed{token: t.lease.FencingToken, free: true}, "", "")
	return 0
}

// lose ends term t and reports it, unless t already ended. It reports
// whether it ended t.
func (c *Cluster) lose(t *term, reason Reason, err error) bool {
	c.renewFailures = 0
	c.stats.renewFailures.Store(0)
	t.end() // leader work stops before, or as, IsLeader turns false
	c.mu.Lock()
	ended := c.term.Load() == t
	if ended {
		c.until.Store(0) // IsLeader turns false before the term is gone
		c.term.Store(nil)
	}
	c.mu.Unlock()
	if !ended {
		return false
	}
	if reason == ReasonSelfFenced {
		c.stats.selfFences.Add(1)
	} else {
		c.stats.lossesTaken.Add(1)
	}
	c.log.Warn("cluster: lease lost", "fencing_token", t.lease.FencingToken, "reason", reason, "err", err)
	c.emit(EventLeaseLost, t.lease.FencingToken, reason)
	return true
}

// campaign tries to acquire the lease. When another term holds it, the
// next attempt is timed for the moment it expires by the database clock,
// and never later than one heartbeat, so a release is noticed promptly.
func (c *Cluster) campaign(ctx context.Context) time.Duration {
	if hold := c.holdUntil.Load(); hold > 0 {
		if left := time.Duration(hold - mono()); left > 0 {
			return left // resigned: let another node take the lease
		}
	}
	start := mono()
	actx, cancel := context.WithTimeout(ctx, c.acquireTimeout())
	poll := c.pollNext
	c.pollNext = false
	l, err := c.provider.Acquire(actx, provider.LeaseRequest{
		Name:     c.cfg.LeaseName,
		Holder:   c.cfg.NodeID,
		Instance: c.instance,
		Endpoint: c.cfg.Endpoint,
		TTL:      c.cfg.LeaseTTL,
		Poll:     poll,
	})
	cancel()
	c.record(OpAcquire, start, err)
	now := mono()

	var held *LeaseHeldError
	switch {
	case err == nil:
		// Check the database before reporting leadership: a rolled-back
		// database must not get a leader that writes on top of it.
		if err := c.verifyAcquired(ctx, l, start); err != nil {
			return c.cfg.HeartbeatInterval
		}
		until := monoAfter(start, c.cfg.FenceTimeout)
		c.mu.Lock()
		if c.stopped {
			// Shutdown began meanwhile: give back the lease just granted.
			c.mu.Unlock()
			if c.release(ctx, l) != nil {
				c.setUnsure(true) // Shutdown tries once more
			}
			return 0
		}
		// Made under mu: its timer's expire, which takes mu, finds it
		// current even when the grant took nearly the whole window and
		// the timer fires at once.
		t := c.newTerm(l, until)
		c.stats.termStart.Store(time.Now().UnixNano())
		c.stats.acquisitions.Add(1)
		c.term.Store(t)
		c.until.Store(until) // after the term: IsLeader implies one
		c.unsure = false
		c.startWork(t)
		c.mu.Unlock()
		c.log.InfoContext(ctx, "cluster: lease acquired", "fencing_token", l.FencingToken)
		c.emit(EventLeaseAcquired, l.FencingToken, "")
		c.observe(observed{token: l.FencingToken}, c.cfg.NodeID, c.cfg.Endpoint)
		return max(c.cfg.HeartbeatInterval-time.Duration(now-start), 0)

	case errors.As(err, &held):
		if held.Instance == c.instance {
			// An earlier acquisition committed but its answer was lost. The
			// error does not say when the attempt that read it began, so
			// the term cannot be trusted from here: end it and campaign
			// again for a term of our own.
			if c.release(ctx, provider.Lease{Name: c.cfg.LeaseName, Holder: held.Holder, Instance: held.Instance, FencingToken: held.FencingToken}) == nil {
				return 0
			}
			return c.cfg.HeartbeatInterval
		}
		c.setUnsure(false)
		c.observe(observed{token: held.FencingToken}, held.Holder, held.Endpoint)
		if held.Holder == c.cfg.NodeID && held.Instance != c.warnedDup {
			c.warnedDup = held.Instance
			c.log.WarnContext(ctx, "cluster: another process with this node id holds the lease; waiting for it to end (is the node id unique?)",
				"holder_instance", held.Instance, "instance", c.instance, "fencing_token", held.FencingToken)
		}
		next := max(held.Remaining+time.Millisecond, time.Millisecond)
		if c.hearing.Load() {
			// A release will be heard: try again only when the lease is due
			// to expire by the database clock, at most one TTL from now.
			return min(next, c.cfg.LeaseTTL)
		}
		wait := c.pollInterval()
		c.pollNext = next > wait // not an attempt at the expiry
		return min(next, wait)

	case errors.Is(err, ErrRollbackDetected):
		// The database refused to grant a token below one it granted before
		// (a lease row truncated or restored on its own): no term here can
		// be trusted until an operator repairs it.
		c.halted = err
		c.log.ErrorContext(ctx, "cluster: the lease row went back below the highest fencing token the database granted; stopped campaigning", "err", err)
		c.events.emit(Event{Kind: EventRollbackDetected, NodeID: c.cfg.NodeID, At: time.Now(), Err: err})
		return c.cfg.HeartbeatInterval

	default:
		// The acquisition may have committed even though we saw an error.
		c.setUnsure(true)
		if ctx.Err() != nil {
			return 0
		}
		c.log.WarnContext(ctx, "cluster: acquire failed", "err", err)
		return c.pollInterval()
	}
}

// pollInterval is how long a follower waits between two attempts, when
// the lease does not expire sooner: a random 80% to 120% of the
// heartbeat, one heartbeat on average, and less than the default
// ResignHoldOff (a heartbeat and a quarter), so that every follower still
// tries before a resigned node campaigns again. Followers that tried
// together (all of them, at a crashed leader's expiry, or after a
// database outage) would otherwise poll together from then on, each
// heartbeat a burst of one statement per member that the leader's renews
// and the next handoff queue behind (at 1000 members through PgBouncer,
// 100-170 ms); one such wait spreads them over 40% of a heartbeat.
func (c *Cluster) pollInterval() time.Duration {
	hb := c.cfg.HeartbeatInterval
	return hb - hb/5 + rand.N(2*hb/5+1)
}

// acquireTimeout bounds one acquisition. A grant is worth having as long
// as its answer comes before FenceTimeout has passed since the attempt
// began, for the term's trust window counts from there; so the bound is
// most of FenceTimeout, not one heartbeat. On a database slowed down by
// load, an attempt bounded by one heartbeat could commit after its caller
// gave up; the next attempt then finds the lease held by this very
// instance, cannot trust a term whose start it does not know, releases it
// and tries again, to be too slow again: no leader at all while the load
// lasts.
func (c *Cluster) acquireTimeout() time.Duration {
	return max(c.cfg.HeartbeatInterval, c.cfg.FenceTimeout-c.cfg.FenceTimeout/10)
}

// verifyAcquired runs the rollback checks for a freshly acquired lease l.
// On failure it releases l; a detected rollback also halts campaigning.
func (c *Cluster) verifyAcquired(ctx context.Context, l provider.Lease, start int64) error {
	if !c.checksRollback() {
		return nil
	}
	vctx, cancel := context.WithTimeout(ctx, time.Duration(monoAfter(start, c.cfg.FenceTimeout)-mono()))
	err := c.verifyIntegrity(vctx, l.FencingToken)
	cancel()
	if err == nil {
		return nil
	}
	if c.release(ctx, l) != nil {
		c.setUnsure(true)
	}
	if errors.Is(err, ErrRollbackDetected) {
		c.halted = err
		c.log.ErrorContext(ctx, "cluster: database rollback detected after acquiring the lease; released it and stopped campaigning",
			"fencing_token", l.FencingToken, "err", err)
		c.events.emit(Event{Kind: EventRollbackDetected, NodeID: c.cfg.NodeID, At: time.Now(), FencingToken: l.FencingToken, Err: err})
		return err
	}
	c.log.WarnContext(ctx, "cluster: could not verify the database after acquiring the lease; released it",
		"fencing_token", l.FencingToken, "err", err)
	return err
}

// stepGrace is how long Shutdown lets a heartbeat step in flight finish
// before cancelling it: half a heartbeat, at most 250ms. A healthy renew
// takes milliseconds; a longer one is cancelled as before.
func stepGrace(heartbeat time.Duration) time.Duration {
	return min(heartbeat/2, 250*time.Millisecond)
}

// quiesce makes sure that no renew of term t, which has ended, is in
// flight or follows, before this node releases t from outside the heartbeat
// goroutine (Shutdown, which cancels the heartbeat's context if that step
// outlasts stepGrace, and Resign). A renew that read the database clock before
// the release and waited for its row lock would otherwise find the row
// unexpired after the release committed, and extend the released lease
// (PostgreSQL and MySQL re-check an UPDATE's condition on the row version
// they waited for, not their clock): the followers the release woke would
// then be refused until it expired. t is nil for a Shutdown with no term:
// an attempt in flight that is granted gives the term back itself, on its
// connection, as Shutdown has begun (campaign). With cut > 0 (Shutdown) a
// step in flight for longer than cut is cancelled, with the heartbeat's
// context; the timer is armed only when a step is in flight.
func (c *Cluster) quiesce(t *term, cut time.Duration) {
	if !c.stepMu.TryLock() { // a step in flight
		if cut > 0 {
			late := time.AfterFunc(cut, c.cancel)
			defer late.Stop()
		}
		c.stepMu.Lock()
	}
	if t != nil {
		t.releasing = true
	}
	c.stepMu.Unlock()
}

// release expires term l in the store, bounded by one heartbeat.
func (c *Cluster) release(ctx context.Context, l provider.Lease) error {
	return c.releaseBy(ctx, func(rctx context.Context) error { return c.provider.Release(rctx, l) })
}

// releaseBy runs release, a release of this node's term, and records it.
// Not cancelled by Shutdown: a term this node ended must be released even
// when Shutdown (from the receiver of the ending's event, say) stops the heartbeat
// meanwhile; the release is bounded by one heartbeat.
func (c *Cluster) releaseBy(ctx context.Context, release func(context.Context) error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HeartbeatInterval)
	defer cancel()
	start := mono()
	err := release(rctx)
	c.record(OpRelease, start, err)
	return err
}

func (c *Cluster) setUnsure(v bool) {
	c.mu.Lock()
	c.unsure = v
	c.mu.Unlock()
}

// observed is a term a node learnt of, or the lease becoming free after
// the term with token. Tokens are unique per term, so they identify it.
type observed struct {
	token uint64
	free  bool
}

// observe records o as the last term or free lease this node observed
// and emits leader-changed, unless it is the one already recorded.
func (c *Cluster) observe(o observed, leader, endpoint string) {
	if o.free {
		leader, endpoint = "", ""
	}
	c.seenMu.Lock()
	defer c.seenMu.Unlock()
	if c.seen == o {
		return
	}
	c.seen, c.seenEndpoint = o, endpoint
	// Under seenMu (emit never blocks), so that events leave in the order
	// seen changed, whichever goroutine observed.
	c.events.emit(Event{Kind: EventLeaderChanged, NodeID: c.cfg.NodeID, At: time.Now(), FencingToken: o.token,
		LeaderID: leader, LeaderEndpoint: endpoint})
}

// watch is the goroutine of a RoleFollower node, which never campaigns: it
// reads the lease about once per heartbeat (pollInterval) to report
// leader-changed.
func (c *Cluster) watch(ctx context.Context) {
	defer c.wg.Done()
	defer c.heartbeating.Store(false)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		rctx, cancel := context.WithTimeout(ctx, c.cfg.HeartbeatInterval)
		l, err := c.provider.Leader(rctx, c.cfg.LeaseName)
		cancel()
		if err == nil {
			c.stats.lastContact.Store(mono())
		}
		switch {
		case err != nil:
			c.log.DebugContext(ctx, "cluster: follower could not read the lease", "err", err)
		case l == nil:
			c.seenMu.Lock()
			last := c.seen.token
			c.seenMu.Unlock()
			c.observe(observed{token: last, free: true}, "", "")
		default:
			c.observe(observed{token: l.FencingToken}, l.NodeID, l.Endpoint)
		}
		c.refreshMembership(ctx, false)
		timer.Reset(c.pollInterval())
	}
}
