// Command chaos is the Jepsen-style experiment of sqlfence/cluster: for
// each dialect it runs 3 to 5 nodes as separate processes, each reaching
// the database through a fault-injecting TCP proxy of its own (SQLite
// nodes share one file and take process faults only), has a seeded nemesis
// kill, pause, partition, slow down, reset and restart them, records every
// write, grant and belief with monotonic timestamps, and checks the merged
// history and the final database. "postgres+pgx" is PostgreSQL through
// clusterpgx: followers LISTEN, releases name their successor, and leaders
// also resign. See RELIABILITY.md at the repository root for what is
// checked and what the latest runs found.
//
//	go run . -duration 2m -dialects sqlite,postgres,postgres+pgx,mysql -seed 1
//
// It exits 0 only when the checker finds nothing; its last line is
// "N ops, M faults, K anomalies" over all dialects.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sqlfence/cluster"
)

// Experiments.
const (
	experimentFaults   = "faults"   // the nemesis, one run per dialect
	experimentFailover = "failover" // a PostgreSQL standby promoted after losing the last commits
)

// Defaults of the servers when the test environment names none.
const (
	defaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultMySQLDSN    = "root@tcp(127.0.0.1:3306)/test"
)

func main() {
	if raw := os.Getenv(envNode); raw != "" {
		os.Exit(nodeMain(raw))
	}
	os.Exit(harnessMain(os.Args[1:]))
}

func harnessMain(args []string) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	duration := fs.Duration("duration", 2*time.Minute, "length of the nemesis schedule, per dialect")
	dialects := fs.String("dialects", "sqlite,postgres,postgres+pgx,mysql", "comma-separated dialects to run, one experiment each; postgres+pgx: PostgreSQL through clusterpgx (LISTEN/NOTIFY handoff, BeginFenced in one round trip)")
	seed := fs.Uint64("seed", 1, "seed of the nemesis schedule")
	nodes := fs.Int("nodes", 3, "nodes per experiment, 3 to 5")
	ttl := fs.Duration("ttl", 2*time.Second, "Config.LeaseTTL")
	heartbeat := fs.Duration("heartbeat", 400*time.Millisecond, "Config.HeartbeatInterval")
	fenceTimeout := fs.Duration("fence-timeout", 1500*time.Millisecond, "Config.FenceTimeout")
	pause := fs.Duration("pause", 20*time.Millisecond, "pause between a leader's writes")
	stale := fs.Int("stale-writes", 2, "writes under the old token after each term ends, which the database must refuse")
	lanes := fs.Int("lanes", 4, "lane keys of the lanes workload, which every node claims and writes under (0: no lanes workload)")
	mutant := fs.String("mutant", "", "run a mutant the checker must catch: skip-fence, long-trust, steal, tip-guard")
	faults := fs.String("faults", "", "comma-separated fault kinds (default: every kind the dialect takes; resign: drawn by default on postgres+pgx only)")
	leaderShare := fs.Float64("leader-share", 0.75, "probability that a fault aims at the current leader")
	cover := fs.Bool("cover", false, "draw every fault kind of the dialect at least once in each schedule (when it has as many faults as kinds)")
	pgDSN := fs.String("postgres-dsn", envOr("CLUSTER_TEST_POSTGRES_DSN", defaultPostgresDSN), "PostgreSQL DSN")
	myDSN := fs.String("mysql-dsn", envOr("CLUSTER_TEST_MYSQL_DSN", defaultMySQLDSN), "MySQL/MariaDB DSN")
	out := fs.String("out", "", "directory for histories, logs and results (default: a new temporary directory)")
	keep := fs.Bool("keep", false, "keep the output directory even when nothing was found")
	jsonOut := fs.String("json", "", "also write the results as JSON to this file")
	mdOut := fs.String("markdown", "", "also write the results as Markdown tables to this file (for RELIABILITY.md)")
	verbose := fs.Bool("v", false, "print each fault as it is injected")
	kind := fs.String("experiment", experimentFaults, "which experiment: faults (the nemesis, per dialect) or failover (PostgreSQL primary and standby, the standby promoted)")
	pgBin := fs.String("pg-bin", "", "failover: directory of initdb, postgres, pg_ctl and pg_basebackup (default: the newest /usr/lib/postgresql/*/bin, or pg_config --bindir)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch *kind {
	case experimentFaults, experimentFailover:
	default:
		fmt.Fprintf(os.Stderr, "chaos: unknown -experiment %q\n", *kind)
		return 2
	}
	if *nodes < 3 || *nodes > 5 {
		fmt.Fprintf(os.Stderr, "chaos: -nodes (%d) must be 3 to 5\n", *nodes)
		return 2
	}
	switch *mutant {
	case mutantNone, mutantSkipFence, mutantLongTrust, mutantSteal, mutantTipGuard:
	default:
		fmt.Fprintf(os.Stderr, "chaos: unknown -mutant %q\n", *mutant)
		return 2
	}
	tm := timings{TTL: *ttl, Heartbeat: *heartbeat, FenceTimeout: *fenceTimeout}
	if err := validTimings(tm); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	dir := *out
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "chaos-"); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
	}
	// The library's own log lines from the harness's connection (schema
	// creation, leader lookups) go to a file beside the histories.
	if err := os.MkdirAll(dir, 0o755); err == nil {
		if f, err := os.Create(filepath.Join(dir, "harness.log")); err == nil {
			defer f.Close()
			slog.SetDefault(slog.New(slog.NewTextHandler(f, nil)))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if *kind == experimentFailover {
		e := &failoverExperiment{Seed: *seed, Nodes: *nodes, Timings: tm, Pause: *pause, Handovers: 2, PGBin: *pgBin, Dir: filepath.Join(dir, "failover")}
		if *verbose {
			e.Log = os.Stdout
		}
		return failoverMain(ctx, e, dir, *out == "", *keep, *jsonOut)
	}
	var kinds []string
	if *faults != "" {
		kinds = strings.Split(*faults, ",")
	}
	var results []*result
	totalOps, totalFaults, totalAnomalies := 0, 0, 0
	failed := false
	for _, d := range strings.Split(*dialects, ",") {
		d = strings.TrimSpace(d)
		dialect, stack, plus := strings.Cut(d, "+")
		if plus && stack != stackPgx {
			fmt.Fprintf(os.Stderr, "chaos: unknown stack %q in -dialects %q (the one stack is postgres+pgx)\n", stack, d)
			return 2
		}
		e := &experiment{
			Dialect: cluster.Dialect(dialect), Stack: stack, Seed: *seed, Duration: *duration, Nodes: *nodes,
			Timings: tm, Pause: *pause, StaleWrites: *stale, Lanes: *lanes, Mutant: *mutant, Kinds: kinds, LeaderShare: *leaderShare, Cover: *cover,
			Dir: filepath.Join(dir, d),
		}
		switch e.Dialect {
		case cluster.Postgres:
			e.DSN = *pgDSN
		case cluster.MySQL:
			e.DSN = *myDSN
		}
		if *verbose {
			e.Log = os.Stdout
		}
		fmt.Printf("== %s: seed %d, %v, %d nodes, LeaseTTL %v, heartbeat %v, FenceTimeout %v%s\n",
			e.label(), e.Seed, e.Duration, e.Nodes, tm.TTL, tm.Heartbeat, tm.FenceTimeout, mutantNote(*mutant))
		res, err := e.run(ctx)
		if err != nil {
			fmt.Printf("%s: experiment failed: %v\n", e.label(), err)
			failed = true
			continue
		}
		res.Timings = tm
		results = append(results, res)
		report(os.Stdout, res)
		totalOps += res.Writes
		totalFaults += len(res.FaultList)
		totalAnomalies += len(res.Anomalies)
	}
	if *jsonOut != "" {
		if b, err := json.MarshalIndent(results, "", "  "); err == nil {
			os.WriteFile(*jsonOut, b, 0o644)
		}
	}
	if *mdOut != "" {
		var b strings.Builder
		markdown(&b, "go run . "+strings.Join(args, " "), results)
		os.WriteFile(*mdOut, []byte(b.String()), 0o644)
	}
	if totalAnomalies > 0 || failed || *keep {
		fmt.Printf("histories and logs: %s\n", dir)
	} else if *out == "" {
		os.RemoveAll(dir)
	}
	fmt.Printf("%d ops, %d faults, %d anomalies\n", totalOps, totalFaults, totalAnomalies)
	if totalAnomalies > 0 || failed {
		return 1
	}
	return 0
}

// failoverMain runs the failover experiment and prints its results, with
// the same last line as the other experiment. dir is removed at the end
// when temp, unless something was found or keep.
func failoverMain(ctx context.Context, e *failoverExperiment, dir string, temp, keep bool, jsonOut string) int {
	fmt.Printf("== failover: seed %d, %d nodes and a new one, PostgreSQL primary and standby, LeaseTTL %v, heartbeat %v, FenceTimeout %v\n",
		e.Seed, e.Nodes, e.Timings.TTL, e.Timings.Heartbeat, e.Timings.FenceTimeout)
	res, err := e.run(ctx)
	ops, faults, anomalies := 0, 0, 0
	if err != nil {
		fmt.Printf("failover: experiment failed: %v\n", err)
	} else {
		reportFailover(os.Stdout, res)
		ops, faults, anomalies = res.Writes, len(res.FaultList), len(res.Anomalies)
		if jsonOut != "" {
			if b, err := json.MarshalIndent(res, "", "  "); err == nil {
				os.WriteFile(jsonOut, b, 0o644)
			}
		}
	}
	if anomalies > 0 || err != nil || keep {
		fmt.Printf("histories and logs: %s\n", dir)
	} else if temp {
		os.RemoveAll(dir)
	}
	fmt.Printf("%d ops, %d faults, %d anomalies\n", ops, faults, anomalies)
	if anomalies > 0 || err != nil {
		return 1
	}
	return 0
}

// validTimings checks the timings as cluster.New will, with the library's
// own messages.
func validTimings(tm timings) error {
	db, err := sql.Open("sqlite", "file::memory:")
	if err != nil {
		return err
	}
	defer db.Close()
	return cluster.Config{NodeID: "x", DB: db, LeaseTTL: tm.TTL, HeartbeatInterval: tm.Heartbeat, FenceTimeout: tm.FenceTimeout}.Validate()
}

func mutantNote(m string) string {
	if m == "" {
		return ""
	}
	return ", mutant " + m
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
