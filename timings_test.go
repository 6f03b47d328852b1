package cluster_test

import (
	"time"

	"github.com/sqlfence/cluster"
)

// slowRenew makes a node renew every 2s instead of every testdb.Heartbeat,
// so that it goes on believing it leads for a while after its lease was
// ended behind its back.
func slowRenew(c *cluster.Config) {
	c.LeaseTTL = 5 * time.Second
	c.HeartbeatInterval = 2 * time.Second
	c.FenceTimeout = 4 * time.Second
}

// longLease gives a node a 10s lease instead of testdb.LeaseTTL, so that a
// quick takeover can only come from a release, not from the lease
// expiring.
func longLease(c *cluster.Config) {
	c.LeaseTTL = 10 * time.Second
	c.FenceTimeout = 5 * time.Second
}
