package cluster

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// The config version: one number per cluster (per LeaseName) in
// <prefix>config that only ever grows. A node that changes the shared
// configuration bumps it; every other node learns of the change within
// about a heartbeat, from a config-version-changed event or from
// ConfigVersionCached.

// configState is a Cluster's view of the config version.
type configState struct {
	// mu orders a bump with what the keeper observes, so the bumping node
	// never sees its own bump as a change.
	mu       sync.Mutex
	version  atomic.Uint64
	known    atomic.Bool // version was read at least once
	watching atomic.Bool // the keeper refreshes version
}

// ConfigVersion reads the cluster's config version from the database,
// creating it at 0 when absent, and updates what
// [Cluster.ConfigVersionCached] returns. It emits config-version-changed
// when the version it reads is higher than one this node saw before.
//
// From the first call of ConfigVersion, ConfigVersionCached or
// BumpConfigVersion on, the node's keeper reads the version once per
// heartbeat, in the statement that renews its lanes when it has claimed
// any (on every dialect), and otherwise in a read of its own (one more
// statement per heartbeat; see BENCHMARKS.md). A node that never calls
// them reads nothing and emits no config-version-changed event. It needs
// a provider that implements [provider.ConfigStore], as the default ones do.
func (c *Cluster) ConfigVersion(ctx context.Context) (uint64, error) {
	if c.isDefault() {
		return stdConfigVersion(ctx)
	}
	store, ok := c.provider.(provider.ConfigStore)
	if !ok {
		return 0, c.errNoCapability("ConfigVersion", "ConfigStore")
	}
	if c.down.Load() {
		return 0, c.errDown
	}
	c.watchConfig()
	v, err := store.ReadConfigVersion(ctx, c.cfg.LeaseName)
	if err != nil {
		return 0, err
	}
	c.observeConfig(v)
	return v, nil
}

// ConfigVersionCached returns the config version this node last saw,
// without I/O: at most one heartbeat stale while the database answers, 0
// before the first read. The first call starts the reads; see
// [Cluster.ConfigVersion].
func (c *Cluster) ConfigVersionCached() uint64 {
	if c.isDefault() {
		return stdConfigVersionCached()
	}
	if !c.conf.watching.Load() {
		c.watchConfig()
	}
	return c.conf.version.Load()
}

// BumpConfigVersion increments the cluster's config version in one
// statement, atomically (bumps from many nodes at once are never lost),
// and returns the version it set. This node's cache takes it at once, so
// this node never reports its own bump as a change; every other node that
// watches the version emits config-version-changed within about a
// heartbeat.
func (c *Cluster) BumpConfigVersion(ctx context.Context) (uint64, error) {
	if c.isDefault() {
		return stdBumpConfigVersion(ctx)
	}
	store, ok := c.provider.(provider.ConfigStore)
	if !ok {
		return 0, c.errNoCapability("BumpConfigVersion", "ConfigStore")
	}
	if c.down.Load() {
		return 0, c.errDown
	}
	c.watchConfig()
	c.conf.mu.Lock()
	defer c.conf.mu.Unlock()
	v, err := store.BumpConfigVersion(ctx, c.cfg.LeaseName)
	if err != nil {
		return 0, err
	}
	if v > c.conf.version.Load() {
		c.conf.version.Store(v)
	}
	c.conf.known.Store(true)
	return v, nil
}

// watchConfig makes the keeper read the config version from now on.
func (c *Cluster) watchConfig() {
	if !c.conf.watching.Swap(true) {
		c.startKeeper()
	}
}

// observeConfig records version v, read from the database, and emits
// config-version-changed when it is higher than a version this node saw
// before. Events leave in the order of the versions.
func (c *Cluster) observeConfig(v uint64) {
	c.conf.mu.Lock()
	defer c.conf.mu.Unlock()
	cur := c.conf.version.Load()
	first := !c.conf.known.Swap(true)
	if v <= cur {
		return
	}
	c.conf.version.Store(v)
	if !first {
		c.log.Info("cluster: config version changed", "config_version", v)
		c.events.emit(Event{Kind: EventConfigVersionChanged, NodeID: c.cfg.NodeID, At: time.Now(), ConfigVersion: v})
	}
}

// refreshConfig is the keeper's read of the config version while no lane
// was claimed.
func (c *Cluster) refreshConfig(ctx context.Context) {
	store, ok := c.provider.(provider.ConfigStore)
	if !ok {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, c.keeperTimeout())
	v, err := store.ReadConfigVersion(rctx, c.cfg.LeaseName)
	cancel()
	c.keeperResult(ctx, "read the config version", err)
	if err == nil {
		c.observeConfig(v)
	}
}
