package cluster

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// watchers are the nodes that watch the releases of one provider's
// leases, by lease name: a release made through the provider wakes the
// others at once, in this process, whatever the dialect.
type watchers struct {
	mu sync.Mutex
	m  map[string]map[*watcher]struct{}
}

type watcher struct {
	instance string
	wake     func()
}

// add registers w on lease name and returns the func that removes it.
func (ws *watchers) add(name string, w *watcher) (remove func()) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m == nil {
		ws.m = map[string]map[*watcher]struct{}{}
	}
	if ws.m[name] == nil {
		ws.m[name] = map[*watcher]struct{}{}
	}
	ws.m[name][w] = struct{}{}
	return func() {
		ws.mu.Lock()
		defer ws.mu.Unlock()
		delete(ws.m[name], w)
		if len(ws.m[name]) == 0 {
			delete(ws.m, name)
		}
	}
}

// wake wakes the watchers of lease name but instance's, the releaser.
// A wake only signals a buffered channel, so it is called under the lock:
// once remove has returned, a removed watcher is never woken.
func (ws *watchers) wake(name, instance string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for w := range ws.m[name] {
		if w.instance != instance {
			w.wake()
		}
	}
}

// WatchReleases implements [provider.ReleaseWatcher]. A release made through p
// wakes the other watchers of p at once. On PostgreSQL, when the Pool is a
// [provider.ListenPool], each watcher also LISTENs, on a connection of its own, on
// channel <prefix>lease, whose payload is the lease name (the release
// statement NOTIFYs it), and reconnects after a failure.
func (p *DBProvider) WatchReleases(ctx context.Context, name, instance string, wake func(), live func(bool)) (stop func()) {
	remove := p.watchers.add(name, &watcher{instance: instance, wake: wake})
	lp, ok := p.pool.(provider.ListenPool)
	if !ok || !p.d.notifies() {
		return remove
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.listen(lctx, lp, name, wake, live)
	}()
	return func() {
		remove()
		cancel()
		<-done
	}
}

// listen LISTENs for the releases of lease name until ctx is done,
// calling wake for each and live when it starts and stops hearing them.
// After a failure it tries again with a growing, jittered delay: every
// node's LISTEN fails at once when the server restarts.
func (p *DBProvider) listen(ctx context.Context, lp provider.ListenPool, name string, wake func(), live func(bool)) {
	channel := p.prefix + "lease"
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		var hearing atomic.Bool
		err := lp.Listen(ctx, channel, func() {
			hearing.Store(true)
			live(true)
		}, func(payload string) {
			if payload == name {
				wake()
			}
		})
		if hearing.Load() {
			live(false)
			backoff = 100 * time.Millisecond // it worked: a new failure starts afresh
		}
		if ctx.Err() != nil {
			return
		}
		p.log.DebugContext(ctx, "cluster: LISTEN for lease releases failed; polling until it is back", "channel", channel, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff + rand.N(backoff/2)):
		}
	}
}

// watchReleases starts hearing releases for a candidate: a release wakes
// the heartbeat, which makes one attempt at once. It returns once a
// release through the same provider would wake this node.
func (c *Cluster) watchReleases(ctx context.Context, w provider.ReleaseWatcher) {
	wake := func() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	var mu sync.Mutex
	var soon *time.Timer
	live := func(on bool) {
		switch was := c.hearing.Swap(on); {
		case was && !on:
			// A follower that slept until the lease's expiry, trusting to
			// hear a release, polls again.
			wake()
		case on && !was:
			// The listener took a connection from the pool, often the one
			// the attempts ran on, which the warm-up had readied: one
			// attempt within half a heartbeat (spread out, as every node's
			// listener starts again after a server restart) opens and
			// warms another, so that the next handoff does not wait to.
			mu.Lock()
			defer mu.Unlock()
			d := rand.N(c.cfg.HeartbeatInterval/2 + 1)
			if soon == nil {
				soon = time.AfterFunc(d, wake)
			} else {
				soon.Reset(d)
			}
		}
	}
	stop := w.WatchReleases(ctx, c.cfg.LeaseName, c.instance, wake, live)
	c.stopWatch = func() {
		stop() // no call of live follows
		mu.Lock()
		defer mu.Unlock()
		if soon != nil {
			soon.Stop()
		}
		c.hearing.Store(false)
	}
}

// stopWatching ends the watch of releases, if one runs.
func (c *Cluster) stopWatching() {
	if c.stopWatch != nil {
		c.stopWatch()
	}
}
