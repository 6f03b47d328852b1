package cluster

import (
	"context"
	"sync"
	"time"
)

// A ReleaseWatcher is an optional capability of a [Provider]: it tells a
// node at once when the lease is released, so that a follower tries to
// acquire it then rather than at its next poll. Correctness never depends
// on it: a node that hears nothing polls as before.
type ReleaseWatcher interface {
	// WatchReleases calls wake when the lease named name is released by a
	// node other than instance, until ctx is done, and then returns nil.
	// It calls live(true) while it hears releases made by other processes
	// (a PostgreSQL LISTEN is connected) and live(false) when it stops
	// hearing them; releases in this process are heard regardless.
	WatchReleases(ctx context.Context, name, instance string, wake func(), live func(bool)) error
}

// A ListenPool is a [Pool] that can LISTEN on PostgreSQL. Listen holds a
// connection of its own, LISTENs on channel, calls ready once it listens
// and notify with each notification's payload, until ctx is done (then it
// returns nil) or the connection fails (then it returns the error).
// clusterpgx's pools implement it.
type ListenPool interface {
	Pool
	Listen(ctx context.Context, channel string, ready func(), notify func(payload string)) error
}

// localReleases wakes the nodes of this process that watch a lease in the
// same database, whatever pool each reaches it through.
var localReleases = struct {
	sync.Mutex
	m map[string]map[*localWaiter]struct{}
}{m: map[string]map[*localWaiter]struct{}{}}

type localWaiter struct {
	instance string
	wake     func()
}

// releaseKey names a lease in one database; "" when the database could not
// be named (then nothing is woken in process).
func (p *DBProvider) releaseKey(name string) string {
	if p.identity == "" {
		return ""
	}
	return p.identity + "\x00" + p.prefix + "\x00" + name
}

// announce wakes the local watchers of lease name, but instance's own.
func (p *DBProvider) announce(name, instance string) {
	key := p.releaseKey(name)
	if key == "" {
		return
	}
	localReleases.Lock()
	defer localReleases.Unlock()
	for w := range localReleases.m[key] {
		if w.instance != instance {
			w.wake()
		}
	}
}

// WatchReleases implements [ReleaseWatcher]: releases in this process are
// heard through memory, and on PostgreSQL, when the Pool is a
// [ListenPool], releases by other processes through LISTEN on channel
// <prefix>lease (the release statement NOTIFYs it), reconnecting after a
// failure while ctx lasts.
func (p *DBProvider) WatchReleases(ctx context.Context, name, instance string, wake func(), live func(bool)) error {
	if key := p.releaseKey(name); key != "" {
		w := &localWaiter{instance: instance, wake: wake}
		localReleases.Lock()
		if localReleases.m[key] == nil {
			localReleases.m[key] = map[*localWaiter]struct{}{}
		}
		localReleases.m[key][w] = struct{}{}
		localReleases.Unlock()
		defer func() {
			localReleases.Lock()
			delete(localReleases.m[key], w)
			if len(localReleases.m[key]) == 0 {
				delete(localReleases.m, key)
			}
			localReleases.Unlock()
		}()
	}
	lp, ok := p.pool.(ListenPool)
	if !ok || !p.d.notifies() {
		<-ctx.Done()
		return nil
	}
	channel := p.prefix + "lease"
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		err := lp.Listen(ctx, channel, func() { live(true) }, func(payload string) {
			if payload == name {
				wake()
			}
		})
		live(false)
		if ctx.Err() != nil {
			return nil
		}
		p.log.DebugContext(ctx, "cluster: LISTEN for lease releases failed; polling until it is back", "channel", channel, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
	}
}

// watchReleases is the goroutine that hears releases for a candidate.
func (c *Cluster) watchReleases(ctx context.Context, w ReleaseWatcher) {
	defer c.wg.Done()
	wake := func() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	live := func(on bool) {
		if was := c.hearing.Swap(on); was && !on {
			wake() // a follower sleeping until the lease's expiry polls again now
		}
	}
	if err := w.WatchReleases(ctx, c.cfg.LeaseName, c.instance, wake, live); err != nil {
		c.log.WarnContext(ctx, "cluster: cannot hear lease releases; polling", "err", err)
	}
	c.hearing.Store(false)
}
