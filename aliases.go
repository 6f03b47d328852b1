package cluster

import "github.com/sqlfence/cluster/provider"

// The values a node and its provider exchange that applications see too;
// they are defined in package provider, the seam.
type (
	// Leader describes the node that holds the lease; see
	// [Cluster.CurrentLeader].
	Leader = provider.Leader
	// A Member is one node process of a cluster; see [Cluster.Members].
	Member = provider.Member
	// A Lane is a lane's row as its store reads it; see
	// [Cluster.LaneOwner].
	Lane = provider.Lane
	// A Chain names a hash-chained, append-only table whose tip the
	// cluster records and checks; see [Config.Chains].
	Chain = provider.Chain
)
