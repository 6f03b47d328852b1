package cluster_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

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

// BenchmarkLaneHistory measures a claim and release of a lane never used
// before (one op: begin, ClaimLane, commit, ReleaseLane) on a node whose
// lease name already has history released lanes, all once held by this
// node's process: services key lanes by tenant, partition or order id,
// so history grows without end, and a claim must not slow down with it.
// It reports the median (median-ms/op) besides the mean. Run with a fixed
// count, as BENCHMARKS.md does:
//
//	go test -run '^$' -bench BenchmarkLaneHistory -benchtime 200x .
func BenchmarkLaneHistory(b *testing.B) {
	for _, d := range testdb.Dialects {
		for _, history := range []int{0, 20_000, 200_000} {
			b.Run(fmt.Sprintf("%s/history=%d", d, history), func(b *testing.B) {
				tg := testdb.New(b, d)
				db := tg.Open(b)
				cfg := tg.Config(b, db, "bench")
				cfg.Logger = nil
				ctx := context.Background()
				c, err := cluster.New(ctx, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Shutdown(ctx)
				members, err := c.Members(ctx)
				if err != nil || len(members) != 1 {
					b.Fatal(members, err)
				}
				addLaneHistory(b, tg, db, members[0].Instance, history)
				var took []time.Duration
				i := 0
				for b.Loop() {
					key := fmt.Sprintf("fresh-%d", i)
					i++
					start := time.Now()
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.ClaimLane(ctx, tx, key); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
					if err := c.ReleaseLane(ctx, key); err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
				}
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "median-ms/op")
			})
		}
	}
}

// addLaneHistory is addHistory, then, on PostgreSQL, a VACUUM ANALYZE
// of what it inserted.
func addLaneHistory(b *testing.B, tg testdb.Target, db *sql.DB, instance string, n int) {
	b.Helper()
	addHistory(b, tg, db, "bench", instance, n)
	// A history that grew over days has been vacuumed and analyzed by
	// then (PostgreSQL's autovacuum would start on these rows during the
	// measurement otherwise); the other dialects keep their statistics
	// as they are, as their servers do.
	if tg.Dialect == cluster.Postgres {
		for _, table := range []string{"lanes", "high_water"} {
			if _, err := db.Exec("VACUUM ANALYZE " + tg.Prefix + table); err != nil {
				b.Fatal(err)
			}
		}
	}
}
