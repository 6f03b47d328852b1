package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
)

// A worker is one RunWhileLeader call.
type worker struct {
	ctx  context.Context
	fn   func(ctx context.Context, token uint64) error
	wake chan *term // the latest term to run fn in; buffered, one slot
}

// RunWhileLeader calls fn each time this node begins a term, with the
// term's fencing token and a context that is cancelled when the term ends
// for any reason: the lease is lost or taken, the trust window closes
// without a renew (the context is cancelled by a timer armed from the same
// deadline as [Cluster.IsLeader], not by the heartbeat noticing), the node
// resigns or shuts down, or ctx is done. If this node already leads, fn
// starts at once for the current term.
//
// fn runs on the calling goroutine, one term at a time. An fn that returns
// an error is logged and not called again until the next term; a panic is
// recovered and logged the same way. RunWhileLeader returns, after fn has
// returned, ctx's error when ctx is done, or an error wrapping
// [ErrShutdown] when the cluster shuts down.
//
// [Cluster.Shutdown] and [Cluster.Resign] cancel the term's context and
// wait for fn to return, within their own context's deadline, before they
// release the lease; meanwhile the lease is still renewed, so no other
// node acquires it while fn runs. An fn that ignores its context past that
// deadline is logged, and the lease is released anyway.
//
// The context is a prompt signal, not a guarantee: a process paused
// between checking it and writing can still write after its term ended.
// Fence every write in the database ([Cluster.Fence]); that is the
// guarantee.
func (c *Cluster) RunWhileLeader(ctx context.Context, fn func(ctx context.Context, token uint64) error) error {
	if c.isDefault() {
		return stdRunWhileLeader(ctx, fn)
	}
	if fn == nil {
		return fmt.Errorf("%w: RunWhileLeader needs a non-nil fn", ErrInvalidConfig)
	}
	w := &worker{ctx: ctx, fn: fn, wake: make(chan *term, 1)}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return c.errShutdown()
	}
	c.workers[w] = struct{}{}
	if t := c.term.Load(); t != nil {
		w.wake <- t
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.workers, w)
		c.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.downCh:
			return c.errShutdown()
		case t := <-w.wake:
			c.runTerm(w, t)
		}
	}
}

// startWork wakes every worker for the new term t. The caller holds c.mu.
func (c *Cluster) startWork(t *term) {
	for w := range c.workers {
		select {
		case <-w.wake: // a term that never ran: replaced by this one
		default:
		}
		w.wake <- t
	}
}

// runTerm runs w's fn for term t, unless t already ended.
func (c *Cluster) runTerm(w *worker, t *term) {
	c.mu.Lock()
	if c.stopped || c.term.Load() != t || t.ctx.Err() != nil {
		c.mu.Unlock()
		return
	}
	c.work.add() // under mu: Shutdown and Resign see it once they end t
	c.mu.Unlock()
	defer c.work.done()

	ctx, cancel := context.WithCancel(t.ctx)
	defer cancel()
	stop := context.AfterFunc(w.ctx, cancel)
	defer stop()
	token := t.lease.FencingToken
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return w.fn(ctx, token)
	}()
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		c.log.Error("cluster: leader work failed; it runs again in the next term", "fencing_token", token, "err", err)
	case err == nil && ctx.Err() == nil:
		c.log.Info("cluster: leader work returned while the term lasts; it runs again in the next term", "fencing_token", token)
	}
}

// waitForWork waits, within ctx, for every running fn to return, and logs
// when some still run past the deadline.
func (c *Cluster) waitForWork(ctx context.Context, what string) {
	if n, err := c.work.wait(ctx); err != nil {
		c.log.WarnContext(ctx, "cluster: leader work ignored its context past the "+what+" deadline; releasing the lease anyway, so another node may start the same work while it runs",
			"running", n, "err", err)
	}
}

// workCount counts running leader work and lets a caller wait, within a
// context, for it to reach zero without a goroutine of its own.
type workCount struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to zero; nil while n is zero
}

func (w *workCount) add() {
	w.mu.Lock()
	if w.n == 0 {
		w.idle = make(chan struct{})
	}
	w.n++
	w.mu.Unlock()
}

func (w *workCount) done() {
	w.mu.Lock()
	w.n--
	if w.n == 0 {
		close(w.idle)
		w.idle = nil
	}
	w.mu.Unlock()
}

// wait returns when nothing runs, or ctx's error and how many still run.
func (w *workCount) wait(ctx context.Context) (int, error) {
	w.mu.Lock()
	idle := w.idle
	w.mu.Unlock()
	if idle == nil {
		return 0, nil
	}
	select {
	case <-idle:
		return 0, nil
	case <-ctx.Done():
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.n, ctx.Err()
	}
}

// Resign ends this node's term now: it cancels the term's context, waits
// (within ctx) for the work RunWhileLeader runs under it, releases the
// lease, and emits lease-released with [ReasonResigned]. The node stays a
// candidate but does not campaign for [Config.ResignHoldOff], so the lease
// moves to another node if there is one, and comes back when there is not.
// Resign returns nil at once when this node does not lead, and an error
// wrapping [ErrShutdown] after Shutdown.
func (c *Cluster) Resign(ctx context.Context) error {
	if c.isDefault() {
		return stdResign(ctx)
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return c.errShutdown()
	}
	t := c.term.Load()
	if t == nil {
		c.mu.Unlock()
		return nil
	}
	c.holdUntil.Store(math.MaxInt64) // until the release, then ResignHoldOff
	c.stats.resigns.Add(1)
	c.retiring.Store(t)
	t.end()
	c.until.Store(0)
	c.term.Store(nil)
	c.mu.Unlock()

	c.waitForWork(ctx, "Resign")
	c.quiesce(t, 0)
	err := c.release(context.WithoutCancel(ctx), t.lease)
	// The hold-off counts from the release: the followers, which try at
	// least once every 1.2 heartbeats, get there first.
	c.holdUntil.Store(monoAfter(mono(), c.cfg.ResignHoldOff))
	c.retiring.CompareAndSwap(t, nil)
	reason := ReasonResigned
	if err != nil {
		reason = ReasonReleaseFailed
		c.log.WarnContext(ctx, "cluster: release on resign failed; the lease expires after LeaseTTL", "fencing_token", t.lease.FencingToken, "err", err)
		err = fmt.Errorf("cluster: resign lease %q: %w", c.cfg.LeaseName, err)
	} else {
		c.stats.releases.Add(1)
		c.log.InfoContext(ctx, "cluster: resigned", "fencing_token", t.lease.FencingToken, "hold_off", c.cfg.ResignHoldOff)
	}
	c.emit(EventLeaseReleased, t.lease.FencingToken, reason)
	if err == nil {
		c.observe(observed{token: t.lease.FencingToken, free: true}, "", "")
	}
	return err
}
