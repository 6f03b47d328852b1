package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/provider"
)

// A leadershipCheck is one system's local "do I lead?" call, on a member
// that leads.
type leadershipCheck struct {
	name     string
	isLeader func() bool
}

// leadershipChecks starts one leading member of each system: this package
// (over a provider that grants every term, so only IsLeader is measured),
// client-go's LeaderElector over an in-memory clientset, and an etcd
// election member on srv (skipped when srv is nil). stop ends them.
func leadershipChecks(ctx context.Context, srv *etcdServer) (checks []leadershipCheck, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()

	c, err := cluster.New(ctx, cluster.Config{NodeID: "bench", Provider: alwaysGranted{}, Logger: quietLogger(false)})
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, func() { c.Shutdown(context.Background()) })
	checks = append(checks, leadershipCheck{"sqlfence", c.IsLeader})

	le, stopLE, err := clientGoLeader()
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, stopLE)
	checks = append(checks, leadershipCheck{"client-go", le.IsLeader})

	if srv != nil {
		m, err := startEtcdMember(srv, "/bench/isleader", "bench", 2, nil)
		if err != nil {
			return nil, stop, err
		}
		stops = append(stops, m.close)
		if err := waitTrue(m.isLeader, 10*time.Second); err != nil {
			return nil, stop, fmt.Errorf("etcd member: %w", err)
		}
		checks = append(checks, leadershipCheck{"etcd", m.isLeader})
	}
	return checks, stop, nil
}

// alwaysGranted is a Provider that grants and renews every term, so a
// benchmark measures IsLeader alone.
type alwaysGranted struct{}

func (alwaysGranted) Acquire(_ context.Context, r provider.LeaseRequest) (provider.Lease, error) {
	return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: 1}, nil
}
func (alwaysGranted) Renew(_ context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
	return l, nil
}
func (alwaysGranted) Release(context.Context, provider.Lease) error { return nil }
func (alwaysGranted) Leader(context.Context, string) (*cluster.Leader, error) {
	return nil, nil
}

var _ provider.Provider = alwaysGranted{}

// clientGoLeader runs a client-go LeaderElector over an in-memory
// clientset until it leads.
func clientGoLeader() (*leaderelection.LeaderElector, func(), error) {
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
		return nil, func() {}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { le.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	if err := waitTrue(le.IsLeader, 10*time.Second); err != nil {
		stop()
		return nil, func() {}, fmt.Errorf("client-go elector: %w", err)
	}
	return le, stop, nil
}

func waitTrue(f func() bool, limit time.Duration) error {
	for deadline := time.Now().Add(limit); !f(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("never led")
		}
	}
	return nil
}

// benchSerial and benchParallel are the two leadership-check benchmarks,
// shared by BenchmarkIsLeader and `go run . compare`.
func benchSerial(b *testing.B, isLeader func() bool) {
	b.ReportAllocs()
	for b.Loop() {
		if !isLeader() {
			b.Fatal("lost leadership")
		}
	}
}

func benchParallel(b *testing.B, isLeader func() bool) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !isLeader() {
				b.Error("lost leadership")
				return
			}
		}
	})
}
