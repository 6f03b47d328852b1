package main

import (
	"context"
	"testing"
)

// BenchmarkIsLeader runs the local leadership check of sqlfence
// (Cluster.IsLeader), client-go (LeaderElector.IsLeader) and etcd (a
// won Campaign and a live Session, see etcdMember.isLeader) side by side,
// each on a member that leads. `go run . compare -only isleader` runs the
// same benchmarks repeatedly and reports medians.
func BenchmarkIsLeader(b *testing.B) {
	srv, err := startEtcd()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.close)
	checks, stop, err := leadershipChecks(context.Background(), srv)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)

	for _, peer := range checks {
		b.Run(peer.name+"/serial", func(b *testing.B) { benchSerial(b, peer.isLeader) })
		b.Run(peer.name+"/parallel", func(b *testing.B) { benchParallel(b, peer.isLeader) })
	}
}
