package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// laneRun is a lane WorkLanes runs fn on.
type laneRun struct {
	token  uint64
	cancel context.CancelFunc
}

// WorkLanes works on the lanes named by keys that are this node's to
// own, so that every lane is worked on by one node at a time and the
// lanes spread over the nodes to within one of even (see
// [Cluster.ClaimLane] for the share): 4 lanes over 3 nodes settle 2/1/1.
//
// Once a heartbeat, while this node holds fewer lanes than its share, it
// claims free lanes of keys (in a transaction of the provider's own, which
// needs the [provider.Transactor] capability the default providers have),
// and for each lane it gets, calls fn on a goroutine of its own with the
// lane's key, its fencing token, and a context that is cancelled when the
// lane is lost (another node took it, an operator released it, or this
// node could not renew it in time), when it is handed over to a node
// below its share, when ctx is done, and when Shutdown begins. When fn
// returns, the lane is released for the next claim, by this node or
// another; one that fn returns early is claimed again at a later
// heartbeat. An error or panic of fn is logged, and this node leaves the
// lane to the others for a while before it claims it again: a heartbeat
// after the first failure, twice as long after each next one in a row,
// up to 30 seconds; a return of nil ends the wait.
//
// The share counts every lane of the cluster's lease, claimed by
// [Cluster.ClaimLane] or by any WorkLanes of any key set: lanes that must
// spread evenly by themselves need a Cluster of their own (a LeaseName).
//
// While fn runs, the lane stays this node's: the keeper renews it, and a
// lane handed over is released only once fn has returned, so no other node
// starts on it before. [Cluster.Shutdown] waits for every fn to return,
// within its context, before it releases the lanes. The context is a
// prompt signal, not the guarantee: fence the lane's writes with
// [Cluster.ClaimLane] in their transaction, and the database refuses them
// once the lane is lost.
//
// WorkLanes returns when ctx is done (ctx's error) or the cluster shuts
// down (an error wrapping [ErrShutdown]), after every fn has returned.
// Keys must be valid lane keys, without repeats; a nil fn or a bad key is
// an error wrapping [ErrInvalidConfig].
func (c *Cluster) WorkLanes(ctx context.Context, keys []string, fn func(ctx context.Context, lane string, token uint64) error) error {
	if c.isDefault() {
		return stdWorkLanes(ctx, keys, fn)
	}
	if err := checkWorkLanes(keys, fn); err != nil {
		return err
	}
	if _, ok := c.provider.(provider.LaneStore); !ok {
		return c.errNoCapability("WorkLanes", "LaneStore")
	}
	txr, ok := c.provider.(provider.Transactor)
	if !ok {
		return c.errNoCapability("WorkLanes", "Transactor")
	}
	if c.down.Load() {
		return c.errDown
	}

	var wg sync.WaitGroup
	running := map[string]laneRun{}
	backoff := laneBackoff{}
	type end struct {
		key    string
		failed bool
	}
	ended := make(chan end, len(keys))
	defer func() {
		for _, r := range running {
			r.cancel()
		}
		wg.Wait()
	}()
	tick := time.NewTicker(c.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		// Stop the work on the lanes this node no longer owns: the events
		// that cancel it at once (see laneEvent) may have come before fn
		// was registered.
		for key, r := range running {
			if !c.OwnsLane(key) {
				r.cancel()
			}
		}
		c.claimLanes(ctx, txr, keys, func(key string) bool {
			_, run := running[key]
			return run || backoff.waiting(key)
		}, func(key string, token uint64) {
			wctx, cancel := context.WithCancel(ctx)
			running[key] = laneRun{token: token, cancel: cancel}
			c.lanes.mu.Lock()
			c.lanes.working[key] = cancel
			_, owned := c.lanes.held[key]
			c.lanes.mu.Unlock()
			if !owned {
				cancel() // lost between the claim and now
			}
			wg.Go(func() {
				defer c.lanes.work.done()
				failed := false
				defer func() { ended <- end{key, failed} }()
				failed = c.workLane(wctx, key, token, fn)
				cancel()
				c.lanes.mu.Lock()
				delete(c.lanes.working, key)
				c.lanes.mu.Unlock()
				// Released for the next claim; after Shutdown began, its
				// stopKeeper releases every lane.
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), c.keeperTimeout())
				if err := c.ReleaseLane(rctx, key); err != nil && !errors.Is(err, ErrShutdown) {
					c.log.WarnContext(ctx, "cluster: releasing a lane after its work returned failed; it expires after LeaseTTL",
						"lane", key, "fencing_token", token, "err", err)
				}
				rcancel()
			})
		})
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.downCh:
			return fmt.Errorf("%w: WorkLanes stopped", c.errDown)
		case e := <-ended:
			delete(running, e.key)
			backoff.ended(e.key, e.failed, c.cfg.HeartbeatInterval)
		case <-tick.C:
		}
	}
}

// checkWorkLanes validates WorkLanes' arguments.
func checkWorkLanes(keys []string, fn func(context.Context, string, uint64) error) error {
	if fn == nil {
		return configErrorf("WorkLanes needs a non-nil fn")
	}
	if len(keys) == 0 {
		return configErrorf("WorkLanes needs at least one lane key")
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if err := checkLaneKey(k); err != nil {
			return err
		}
		if seen[k] {
			return configErrorf("WorkLanes was given lane key %q twice", k)
		}
		seen[k] = true
	}
	return nil
}

// laneRetryMax is the longest WorkLanes leaves a lane whose work keeps
// failing before it claims it again.
const laneRetryMax = 30 * time.Second

// laneBackoff is when WorkLanes may claim again a lane whose work failed,
// and how many times in a row it failed.
type laneBackoff map[string]struct {
	fails int
	until time.Time
}

// ended records the end of a lane's work: a failure doubles the wait
// (from one heartbeat, up to laneRetryMax), a success ends it.
func (b laneBackoff) ended(key string, failed bool, heartbeat time.Duration) {
	if !failed {
		delete(b, key)
		return
	}
	e := b[key]
	e.fails++
	wait := laneRetryMax
	if e.fails <= 30 && heartbeat<<(e.fails-1) < laneRetryMax {
		wait = heartbeat << (e.fails - 1)
	}
	e.until = time.Now().Add(wait)
	b[key] = e
}

// waiting reports whether the lane's wait after a failure lasts.
func (b laneBackoff) waiting(key string) bool {
	e, ok := b[key]
	return ok && time.Now().Before(e.until)
}

// claimLanes claims, in one round, free lanes of keys not skipped, from a
// random key on so that nodes do not all contend for the first, until
// this node reaches its share; start is called for each lane claimed. A
// round costs no statement while the keeper's last census says this node
// holds its share. Until the keeper's first census, a round claims one
// lane at most: nodes that start together have not all recorded that they
// take lanes yet, and the first to claim would otherwise take every lane
// and hand most over a heartbeat later.
func (c *Cluster) claimLanes(ctx context.Context, txr provider.Transactor, keys []string, skip func(string) bool, start func(string, uint64)) {
	if c.lanesFull() {
		return
	}
	off := rand.IntN(len(keys))
	for i := range keys {
		key := keys[(off+i)%len(keys)]
		if skip(key) {
			continue
		}
		if ctx.Err() != nil || c.down.Load() {
			return
		}
		// Reserved against another WorkLanes of this node with the key.
		c.lanes.mu.Lock()
		_, busy := c.lanes.working[key]
		if !busy {
			if c.lanes.working == nil {
				c.lanes.working = map[string]context.CancelFunc{}
			}
			c.lanes.working[key] = nil
		}
		c.lanes.mu.Unlock()
		if busy {
			continue
		}
		var token uint64
		// Counted before the claim, so that Shutdown, which waits for
		// the count before releasing lanes, never misses one.
		c.lanes.work.add()
		err := txr.InTx(ctx, func(tx provider.Querier) error {
			var err error
			token, err = c.claimLane(ctx, tx, key)
			return err
		})
		if err == nil {
			start(key, token)
			c.lanes.mu.Lock()
			first := !c.lanes.hasCensus
			c.lanes.mu.Unlock()
			if first {
				return
			}
			continue
		}
		c.lanes.mu.Lock()
		delete(c.lanes.working, key)
		c.lanes.mu.Unlock()
		c.lanes.work.done()
		var held *LaneHeldError
		switch {
		case errors.As(err, &held):
		case errors.Is(err, ErrLaneLimit), errors.Is(err, ErrDuplicateNodeID), errors.Is(err, ErrShutdown):
			return
		case ctx.Err() == nil:
			c.log.DebugContext(ctx, "cluster: WorkLanes could not claim a lane; it tries again at the next heartbeat", "lane", key, "err", err)
		}
	}
}

// lanesFull reports whether the keeper's last census says this node holds
// its share, so that a new claim would be refused.
func (c *Cluster) lanesFull() bool {
	c.lanes.mu.Lock()
	defer c.lanes.mu.Unlock()
	census, ok := c.lanes.census, c.lanes.hasCensus
	if !ok {
		return false
	}
	census.Mine = len(c.lanes.held) + c.lanes.pending
	limit, _ := c.laneLimit(census, false, false)
	return census.Mine >= limit
}

// callLaneWork calls fn for a lane and returns its error, or its panic
// as an error.
func callLaneWork(ctx context.Context, key string, token uint64, fn func(context.Context, string, uint64) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn(ctx, key, token)
}

// workLane calls fn for a lane, logging its error or panic, and reports
// whether it failed: an error or panic while the lane was still worked on
// (not one that ctx's end caused).
func (c *Cluster) workLane(ctx context.Context, key string, token uint64, fn func(context.Context, string, uint64) error) bool {
	err := callLaneWork(ctx, key, token, fn)
	if err != nil && ctx.Err() == nil {
		c.log.ErrorContext(ctx, "cluster: lane work failed; the lane is released, and this node claims it again after a wait that doubles with each failure in a row",
			"lane", key, "fencing_token", token, "err", err)
		return true
	}
	return false
}
