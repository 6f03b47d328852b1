package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// membershipEvery is how many heartbeats pass between two refreshes of a
// node's membership row, where the lease statements do not refresh it
// themselves.
const membershipEvery = 3

// memberTimeout is how long a member may go unseen, by the database clock,
// before it is no longer live: a lease TTL and a few refreshes.
func (c *Cluster) memberTimeout() time.Duration {
	return c.cfg.LeaseTTL + membershipEvery*c.cfg.HeartbeatInterval
}

// Members lists the node processes of this cluster (of this lease name),
// by the database clock: a member is Live while it is active and was seen
// within LeaseTTL plus three heartbeats; at most one is Leader, the one
// the lease row names while its term is unexpired (the lease row decides,
// never a flag a node sets). Members that left stay listed, with status
// "left", until a node that joins an hour or more later takes over their
// row; members whose process died without Shutdown, listed as not Live,
// until one joins a week after they were last seen. It needs a provider
// that implements [provider.MemberStore], as the default ones do.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	if c.isDefault() {
		return stdMembers(ctx)
	}
	if c.members == nil {
		return nil, c.errNoCapability("Members", "MemberStore")
	}
	if c.down.Load() {
		return nil, c.errDown
	}
	ms, err := c.members.Members(ctx, c.cfg.LeaseName, c.memberTimeout())
	if err != nil {
		return nil, fmt.Errorf("cluster: read members of lease %q: %w", c.cfg.LeaseName, err)
	}
	return ms, nil
}

// join records this node as a member at Init. Membership is for
// operators: a failure is logged, not fatal. It returns the error; the
// caller makes a later join due unless the database is read-only (a
// follower on a replica), which no later join changes.
func (c *Cluster) join(ctx context.Context) error {
	if err := c.recordMembership(ctx, c.cfg.HeartbeatInterval); err != nil {
		if errors.Is(err, ErrReadOnly) {
			c.log.WarnContext(ctx, "cluster: the database is read-only, so this node's membership is not recorded; Members does not list it", "err", err)
		} else {
			c.log.WarnContext(ctx, "cluster: could not record this node's membership; Members does not list it until a join at a later heartbeat succeeds", "err", err)
		}
		return err
	}
	c.rowChecked.Store(mono())
	return nil
}

// recordMembership records this node as an active member, bounded by
// timeout; on success it marks the row joined and counts the join (the
// lanes' keeper takes lanes again after a join it has not counted). It is
// join's, and joinAgain's, one statement.
func (c *Cluster) recordMembership(ctx context.Context, timeout time.Duration) error {
	host, _ := os.Hostname()
	m := Member{NodeID: c.cfg.NodeID, Instance: c.instance, Host: host, PID: os.Getpid(), Endpoint: c.cfg.Endpoint,
		Timeout: c.memberTimeout()}
	jctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.members.Join(jctx, c.cfg.LeaseName, m); err != nil {
		return err
	}
	c.joined.Store(true)
	c.joins.Add(1)
	return nil
}

// member reports whether this node's membership row is recorded, as far
// as this node knows: it joined, has not left, and no join is due.
func (c *Cluster) member() bool {
	return c.joined.Load() && !c.mustJoin.Load()
}

// joinAgain is a join when one is due (mustJoin): the join at Init failed,
// a refresh found the row taken over while this node went unseen, or an
// earlier joinAgain failed. On success it clears mustJoin; so does a
// read-only database, which no later join changes (logged at Warn). Any
// other failure is logged at Debug (the first, at Init or when the row was
// found taken over, was logged louder) and left for a later heartbeat. A
// join that failed may have committed (its answer lost): joining again
// then updates the row, and counts, so the lanes' keeper takes lanes
// again. One runs at a time (joining): see joinLater and joinNow.
func (c *Cluster) joinAgain(ctx context.Context, timeout time.Duration) {
	err := c.recordMembership(ctx, timeout)
	switch {
	case err == nil:
		c.mustJoin.Store(false)
		c.rowChecked.Store(mono())
		c.log.InfoContext(ctx, "cluster: recorded this node's membership")
	case errors.Is(err, ErrReadOnly):
		c.mustJoin.Store(false)
		c.log.WarnContext(ctx, "cluster: the database is read-only, so this node's membership is not recorded; Members does not list it", "err", err)
	case ctx.Err() == nil:
		c.log.DebugContext(ctx, "cluster: recording this node's membership failed again; Members does not list it and it does not count in the lanes' fair share yet", "err", err)
	}
}

// joinLater runs joinAgain on a goroutine of its own (memberLater): the
// heartbeat asks for it, and a join, bounded by timeout on a database slow
// enough to have failed one, must not delay the renew or the attempt that
// follows (a leader's renew delayed past FenceTimeout would end its term).
func (c *Cluster) joinLater(ctx context.Context, timeout time.Duration) {
	c.memberLater(func() { c.joinAgain(ctx, timeout) })
}

// memberLater runs f, a membership statement of the heartbeat's, on a
// goroutine of its own, counted in wg, unless one runs already (joining):
// a refresh or a join never delays a lease statement, and a database that
// is slow to answer them has at most one of them in flight per node.
func (c *Cluster) memberLater(f func()) {
	if !c.joining.CompareAndSwap(false, true) {
		return
	}
	c.wg.Add(1) // from a goroutine counted in wg: the heartbeat's, or the default provider's release watcher
	go func() {
		defer c.wg.Done()
		defer c.joining.Store(false)
		f()
	}()
}

// joinNow runs joinAgain on the caller's goroutine (the lanes' keeper,
// whose next step needs the membership), unless a join runs already.
func (c *Cluster) joinNow(ctx context.Context, timeout time.Duration) {
	if !c.joining.CompareAndSwap(false, true) {
		return
	}
	defer c.joining.Store(false)
	c.joinAgain(ctx, timeout)
}

// refreshMembership refreshes this node's membership every few heartbeats;
// candidate is true for a node whose lease statements may refresh it
// already: then it only checks, every cfg.opts.rowCheckEvery, that the row is
// still there (options.rowCheckEvery). When a join is due (mustJoin) it starts one instead
// (joinLater), at each heartbeat step until one succeeds. The refresh,
// and the join after a refresh that found the row taken over, run on a
// goroutine of their own (memberLater), so that a refresh bounded by a
// heartbeat on a slow database never delays the renew that follows (at
// the default timings it would start when the leader's trust ran out).
// While one runs, steps are not counted.
func (c *Cluster) refreshMembership(ctx context.Context, candidate bool) {
	if c.members == nil || c.joining.Load() {
		return
	}
	if c.mustJoin.Load() {
		c.joinLater(ctx, c.cfg.HeartbeatInterval)
		return
	}
	if !c.joined.Load() {
		return
	}
	if candidate && c.members.SeenByLease() {
		now := mono()
		if time.Duration(now-c.rowChecked.Load()) < c.cfg.opts.rowCheckEvery {
			return
		}
		c.rowChecked.Store(now)
	} else if c.steps++; c.steps%membershipEvery != 0 {
		return
	}
	c.memberLater(func() {
		sctx, cancel := context.WithTimeout(ctx, c.cfg.HeartbeatInterval)
		defer cancel()
		err := c.members.Seen(sctx, c.cfg.LeaseName, c.instance)
		switch {
		case errors.Is(err, provider.ErrNotMember):
			c.rowTakenOver(ctx, err)
			c.joinAgain(ctx, c.cfg.HeartbeatInterval)
		case err != nil:
			c.log.DebugContext(ctx, "cluster: membership refresh failed", "err", err)
		}
	})
}

// rowTakenOver records that a refresh found this node's membership row
// taken over (err): a join is due.
func (c *Cluster) rowTakenOver(ctx context.Context, err error) {
	c.log.InfoContext(ctx, "cluster: this node's membership row was taken over while it went unseen; joining again", "err", err)
	c.mustJoin.Store(true)
}

// leave marks this node as left, on Shutdown.
func (c *Cluster) leave(ctx context.Context) {
	// A join still due may be one whose answer was lost, its row there.
	if c.members == nil || !c.joined.Swap(false) && !c.mustJoin.Load() {
		return
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HeartbeatInterval)
	defer cancel()
	if err := c.members.Leave(lctx, c.cfg.LeaseName, c.instance); err != nil {
		c.log.WarnContext(ctx, "cluster: could not mark this node as left; it will show as not live after the node timeout", "err", err)
	}
}
