// Package bench compares the hot path of sqlfence/cluster with peers in
// the same run. It is its own module so that library users never download
// the peers. See BENCHMARKS.md at the repository root.
package bench

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/sqlfence/cluster"
)

// alwaysGranted is a Provider that grants and renews every term, so the
// benchmark measures IsLeader alone.
type alwaysGranted struct{}

func (alwaysGranted) Acquire(_ context.Context, r cluster.LeaseRequest) (cluster.Lease, error) {
	return cluster.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: 1}, nil
}
func (alwaysGranted) Renew(_ context.Context, l cluster.Lease, _ time.Duration) (cluster.Lease, error) {
	return l, nil
}
func (alwaysGranted) Release(context.Context, cluster.Lease) error { return nil }
func (alwaysGranted) Leader(context.Context, string) (*cluster.Leader, error) {
	return nil, nil
}

// clientGoLeader runs a client-go LeaderElector over an in-memory clientset
// until it leads.
func clientGoLeader(b *testing.B) *leaderelection.LeaderElector {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: "bench", Namespace: "default"},
		Client:     fake.NewClientset().CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: "bench"},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: 15 * time.Second,
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   2 * time.Second,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { le.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(10 * time.Second); !le.IsLeader(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("client-go elector never led")
		}
	}
	return le
}

// BenchmarkIsLeader runs sqlfence's IsLeader and client-go's
// LeaderElector.IsLeader side by side.
func BenchmarkIsLeader(b *testing.B) {
	c, err := cluster.New(context.Background(), cluster.Config{NodeID: "bench", Provider: alwaysGranted{}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Shutdown(context.Background()) })
	le := clientGoLeader(b)

	for _, peer := range []struct {
		name     string
		isLeader func() bool
	}{
		{"sqlfence", c.IsLeader},
		{"client-go", le.IsLeader},
	} {
		b.Run(peer.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !peer.isLeader() {
					b.Fatal("lost leadership")
				}
			}
		})
		b.Run(peer.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if !peer.isLeader() {
						b.Error("lost leadership")
						return
					}
				}
			})
		})
	}
}
