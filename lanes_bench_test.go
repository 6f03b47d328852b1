package cluster_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// BenchmarkOwnsLane measures the per-item check of a partitioned worker:
// a binary search of an immutable snapshot and one clock read, with 0
// allocs/op. The node owns 64 lanes; "miss" asks for one it does not own.
// See BENCHMARKS.md.
func BenchmarkOwnsLane(b *testing.B) {
	tg := testdb.New(b, cluster.SQLite)
	db := tg.Open(b)
	cfg := tg.Config(b, db, "bench")
	cfg.Logger = nil
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	ctx := context.Background()
	for i := range 64 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.ClaimLane(ctx, tx, fmt.Sprintf("partition-%02d", i)); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("hit/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !c.OwnsLane("partition-42") {
				b.Fatal("lost the lane")
			}
		}
	})
	b.Run("miss/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if c.OwnsLane("partition-99") {
				b.Fatal("owns a lane it never claimed")
			}
		}
	})
	b.Run("hit/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !c.OwnsLane("partition-42") {
					b.Error("lost the lane")
					return
				}
			}
		})
	})
}
