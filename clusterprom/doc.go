// Package clusterprom exports the metrics of a [cluster.Cluster] to
// Prometheus. It is a module of its own, so that only programs that import
// it download the Prometheus client; the cluster module does not require it.
//
// # Use
//
// A [Metrics] belongs to one node. [Register] wires it in one call, after
// New or Init:
//
//	c, err := cluster.New(ctx, cfg) // or cluster.Init, then c := cluster.Default()
//	...
//	m, err := clusterprom.Register(prometheus.DefaultRegisterer, c)
//
// To count the calls New makes before it returns (the first acquisition),
// wire it by hand instead: make it from the Config, set its Observe method
// as the Config's Observer, create the Cluster, Watch it, and register it:
//
//	m := clusterprom.New(cfg)
//	cfg.Observer = m.Observe
//	c, err := cluster.New(ctx, cfg)
//	...
//	m.Watch(c)
//	prometheus.MustRegister(m)
//
// Observe counts the node's provider calls and records their latency as
// they happen (see [cluster.Config.Observer]). On every scrape, Collect
// reads [cluster.Cluster.Stats] of the watched Cluster, which does no I/O
// and takes no lock, so a scrape never waits on the database or on the
// heartbeat.
//
// # Several Clusters in one process
//
// Make one Metrics per Cluster. Every metric carries the constant labels
// node_id ([cluster.Config.NodeID]) and lease ([cluster.Config.LeaseName],
// or [cluster.DefaultLeaseName]), so the Metrics of Clusters that differ in
// either register side by side in one registry; two Metrics with the same
// node and lease are refused by the registry as duplicates. To add labels
// of your own, register through [prometheus.WrapRegistererWith].
//
// # Metrics
//
// Fed by Observe, one for every provider call:
//
//	sqlfence_cluster_operations_total{op, outcome}    counter: provider calls, by cluster.OpKind and cluster.Outcome
//	sqlfence_cluster_renew_duration_seconds           histogram: renew latency, whatever the outcome
//	sqlfence_cluster_operation_duration_seconds{op}   histogram: latency of the other calls (acquire, release, fence, lane calls)
//
// Read from Stats on every scrape, once a Cluster is watched:
//
//	sqlfence_cluster_leader                           gauge: 1 while this node leads, else 0
//	sqlfence_cluster_fencing_token                    gauge: the token of the term it leads in, or 0
//	sqlfence_cluster_term_start_timestamp_seconds     gauge: when its term began; absent when it does not lead
//	sqlfence_cluster_last_renew_duration_seconds      gauge: the last successful renew's latency; absent before one
//	sqlfence_cluster_consecutive_renew_failures       gauge: failed renews since the last successful one
//	sqlfence_cluster_last_contact_age_seconds         gauge: since the database last answered; absent before it did
//	sqlfence_cluster_acquisitions_total               counter: terms begun
//	sqlfence_cluster_losses_total{reason}             counter: terms lost, by cluster.Reason: lease-taken, self-fenced
//	sqlfence_cluster_resigns_total                    counter: terms ended by Resign
//	sqlfence_cluster_releases_total                   counter: leases released by Shutdown or Resign
//	sqlfence_cluster_lanes_held                       gauge: lanes this node believes it owns
//	sqlfence_cluster_lane_acquisitions_total          counter: lane claims begun (lane-acquired)
//	sqlfence_cluster_lane_losses_total                counter: lanes lost without releasing them (lane-lost)
//	sqlfence_cluster_lane_releases_total              counter: lanes released, handed over or released by Shutdown (lane-released)
//
// Durations are in seconds. The renew histogram covers failed renews too,
// so a database that slows down until renews time out shows there as it
// approaches [cluster.Config.FenceTimeout]; the last-renew gauge is that of
// the last successful one, as in Stats. The last-contact age is measured on
// the node's monotonic clock at the scrape, so it does not depend on the
// clocks of the node and the Prometheus server agreeing. The term start is
// the node's own wall clock. The fencing token is exported as a float64,
// exact up to 2^53 terms.
//
// A program that uses the package-level Cluster ([cluster.Init]) can set
// Observe as its Config's Observer, but has no Cluster to Watch: it gets
// the metrics fed by Observe only.
package clusterprom
