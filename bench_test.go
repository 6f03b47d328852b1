package cluster_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// BenchmarkIsLeader measures the hot path, called on every request.
// Target: ≤ 25 ns/op and 0 allocs/op serially. IsLeader reads the
// monotonic clock on every call (so a resumed process sees false at once);
// the "clock" peer is that read alone, the floor on this machine, and the
// "rwmutex" peer is the lock-and-compare design of client-go's
// LeaderElector.IsLeader, in the same run for comparison. See BENCHMARKS.md.
func BenchmarkIsLeader(b *testing.B) {
	c, err := cluster.New(context.Background(), cluster.Config{
		NodeID:   "bench",
		Provider: &fakeProvider{},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	if !c.IsLeader() {
		b.Fatal("not leader")
	}
	peer := &rwmutexPeer{leader: "bench", self: "bench", until: time.Now().Add(time.Hour)}
	start := time.Now()

	b.Run("cluster/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !c.IsLeader() {
				b.Fatal("lost leadership")
			}
		}
	})
	b.Run("cluster/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !c.IsLeader() {
					b.Error("lost leadership")
					return
				}
			}
		})
	})
	b.Run("clock/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if time.Since(start) < 0 {
				b.Fatal("clock went back")
			}
		}
	})
	b.Run("rwmutex/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !peer.IsLeader() {
				b.Fatal("lost leadership")
			}
		}
	})
	b.Run("rwmutex/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !peer.IsLeader() {
					b.Error("lost leadership")
					return
				}
			}
		})
	})
}

// rwmutexPeer is the common lock-guarded design: compare the recorded
// holder with ourselves and the expiry with the wall clock.
type rwmutexPeer struct {
	mu           sync.RWMutex
	leader, self string
	until        time.Time
}

func (p *rwmutexPeer) IsLeader() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.leader == p.self && time.Now().Before(p.until)
}
