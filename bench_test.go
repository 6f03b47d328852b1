package cluster_test

import (
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
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
	b.Run("default/serial", func(b *testing.B) {
		// The package-level IsLeader before Init: one atomic load, no
		// clock read (the single leader's deadline never comes).
		if cluster.Default().Clustered() {
			b.Skip("Init was called in this process; the single-leader path is gone")
		}
		b.ReportAllocs()
		for b.Loop() {
			if !cluster.IsLeader() {
				b.Fatal("a process that never called Init does not lead")
			}
		}
	})
	b.Run("default-member/serial", func(b *testing.B) {
		// The package-level IsLeader after Init, on the member that leads:
		// the same load and clock read as cluster/serial.
		if cluster.Default().Clustered() {
			b.Skip("Init was called in this process already")
		}
		defer cluster.ResetDefault()
		err := cluster.Init(context.Background(), cluster.Config{NodeID: "bench-default", Provider: &fakeProvider{}})
		if err != nil {
			b.Fatal(err)
		}
		defer cluster.Shutdown(context.Background())
		b.ReportAllocs()
		for b.Loop() {
			if !cluster.IsLeader() {
				b.Fatal("lost leadership")
			}
		}
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

// benchConfig is the configuration of a benchmark's one leading node on
// db: no logger, and long timings, as on SQLite a loop of write
// transactions can starve the renew (see the README).
func benchConfig(b *testing.B, tg testdb.Target, db *sql.DB) cluster.Config {
	cfg := tg.Config(b, db, "bench")
	cfg.Logger = nil
	cfg.LeaseTTL, cfg.HeartbeatInterval, cfg.FenceTimeout = 30*time.Second, time.Second, 25*time.Second
	return cfg
}

// BenchmarkAdvanceTip measures a fenced transaction that advances a chain
// tip (begin, Fence, AdvanceTip, commit), without and with a witness file,
// whose cost is one more tip read and an fsynced file write per call. It
// runs on every dialect whose DSN is set (see internal/testdb).
func BenchmarkAdvanceTip(b *testing.B) {
	for _, d := range testdb.Dialects {
		for _, witness := range []bool{false, true} {
			name := string(d) + "/no-witness"
			if witness {
				name = string(d) + "/witness"
			}
			b.Run(name, func(b *testing.B) {
				tg := testdb.New(b, d)
				ctx := context.Background()
				db := tg.Open(b)
				cfg := benchConfig(b, tg, db)
				cfg.Chains = []cluster.Chain{{Name: "audit", Table: tg.Prefix + "audit"}}
				if witness {
					cfg.WitnessFile = filepath.Join(b.TempDir(), "witness.json")
				}
				if _, err := db.Exec("CREATE TABLE " + tg.Prefix + "audit (monotonic_counter BIGINT PRIMARY KEY, row_hash VARCHAR(64) NOT NULL)"); err != nil {
					b.Fatal(err)
				}
				c, err := cluster.New(ctx, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Shutdown(ctx)
				n := uint64(0)
				for b.Loop() {
					n++
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.Fence(ctx, tx); err != nil {
						b.Fatal(err)
					}
					if err := c.AdvanceTip(ctx, tx, "audit", n, []byte("h")); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkFence measures what Fence adds to a transaction against a plain
// read of the same lease row in its place (begin, the read or Fence,
// rollback), on every dialect whose DSN is set:
//
//	go test -run '^$' -bench BenchmarkFence -benchtime 2000x .
func BenchmarkFence(b *testing.B) {
	for _, d := range testdb.Dialects {
		b.Run(string(d), func(b *testing.B) {
			tg := testdb.New(b, d)
			ctx := context.Background()
			db := tg.Open(b)
			c, err := cluster.New(ctx, benchConfig(b, tg, db))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Shutdown(ctx)
			read := "SELECT fencing_token FROM " + tg.Prefix + "lease WHERE name = ?"
			if d == cluster.Postgres {
				read = "SELECT fencing_token FROM " + tg.Prefix + "lease WHERE name = $1"
			}
			// fence-deadline: in a context with a deadline, as a request's
			// (one second: the read's time limit is then 512 ms).
			for _, form := range []string{"read", "fence", "fence-deadline"} {
				b.Run(form, func(b *testing.B) {
					for b.Loop() {
						tx, err := db.BeginTx(ctx, nil)
						if err != nil {
							b.Fatal(err)
						}
						switch form {
						case "fence":
							_, err = c.Fence(ctx, tx)
						case "fence-deadline":
							fctx, cancel := context.WithTimeout(ctx, time.Second)
							_, err = c.Fence(fctx, tx)
							cancel()
						default:
							var token int64
							err = tx.QueryRowContext(ctx, read, cluster.DefaultLeaseName).Scan(&token)
						}
						if err != nil {
							b.Fatal(err)
						}
						tx.Rollback()
					}
				})
			}
		})
	}
}

// BenchmarkReleaseCall measures how long Shutdown and Resign take, on a
// leader with nothing in flight, to reach the provider's Release: the
// part of a handoff that is this package's own code (an in-memory
// provider, so no database). Each iteration starts a leader (untimed)
// and releases it; the metric "µs-to-release" is the mean from the call
// to Release being called. BENCHMARKS.md of 2026-12-03
// ("Systems taking turns", in git) quoted it.
func BenchmarkReleaseCall(b *testing.B) {
	for _, mode := range []string{"Shutdown", "Resign"} {
		b.Run(mode, func(b *testing.B) {
			var total time.Duration
			for range b.N {
				b.StopTimer()
				var at time.Time
				p := &fakeProvider{ReleaseFunc: func(context.Context, provider.Lease) error {
					at = time.Now()
					return nil
				}}
				c, err := cluster.New(context.Background(), cluster.Config{
					NodeID: "a", Provider: p, LeaseTTL: testdb.LeaseTTL, HeartbeatInterval: testdb.Heartbeat,
					FenceTimeout: testdb.FenceTimeout, Logger: slog.New(slog.DiscardHandler),
				})
				if err != nil {
					b.Fatal(err)
				}
				for !c.IsLeader() {
					time.Sleep(time.Millisecond)
				}
				// The first renew comes a heartbeat after the grant: none
				// is in flight now, the common case.
				time.Sleep(5 * time.Millisecond)
				b.StartTimer()
				start := time.Now()
				if mode == "Resign" {
					err = c.Resign(context.Background())
				} else {
					err = c.Shutdown(context.Background())
				}
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if at.IsZero() {
					b.Fatalf("%s returned without calling the provider's Release", mode)
				}
				total += at.Sub(start)
				c.Shutdown(context.Background())
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-to-release")
		})
	}
}
