package cluster_test

import (
	"time"

	"github.com/sqlfence/cluster"
)

// slowRenew makes a node renew every 2s, so that it goes on believing it
// leads for a while after its lease was ended behind its back.
func slowRenew(c *cluster.Config) {
	c.LeaseTTL = 5 * time.Second
	c.HeartbeatInterval = 2 * time.Second
	c.FenceTimeout = 4 * time.Second
}

// longLease gives a node a 10s lease, so that a quick takeover can only
// come from a release.
func longLease(c *cluster.Config) {
	c.LeaseTTL = 10 * time.Second
	c.FenceTimeout = 5 * time.Second
}
