package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// compareRun is what one `go run . compare` shares between its parts.
type compareRun struct {
	dsns      dsns
	prefix    string
	tm        timings
	mode      releaseMode
	pgSuffix  string
	pgConfig  func(*cluster.Config) error
	pgHandoff string
	procs     bool // this package's members run as processes of their own
	verbose   bool
	out       string
	rng       *rand.Rand
	etcd      *etcdServer
	targets   map[string]target // every target used, for the final clean-up
	targetsMu sync.Mutex
}

func compare(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	only := fs.String("only", "isleader,handoff,takeover,fence", "which measurements to run, comma-separated")
	systems := fs.String("systems", "sqlite,postgres,mariadb,client-go,etcd", "systems for the handoff and takeover trials: sqlite, postgres, mariadb, pgx, client-go, etcd, and etcd/procs (etcd's members each an OS process of its own, as -procs makes this package's)")
	fenceSystems := fs.String("fence-systems", "sqlite,sqlite/own-pool,postgres,postgres+begin,mariadb,mariadb/own-pool,mariadb+ip,pgx,pgx+begin", "targets of the fenced-transaction comparison (mariadb+ip: the MySQL DSN with interpolateParams=true; pgx+begin and postgres+begin: the fenced form begun with clusterpgx.BeginFenced or, through database/sql on a pool of clusterpgx.OpenDB, Cluster.BeginFenced, one round trip for the BEGIN and the fence; /own-pool: the application's transactions on a *sql.DB of their own rather than the member's, where Fence does not run the read New prepared)")
	trials := fs.Int("trials", 30, "handoff and takeover trials per system")
	ttl := fs.Duration("ttl", 2*time.Second, "LeaseTTL, client-go's LeaseDuration and etcd's session TTL (whole seconds)")
	heartbeat := fs.Duration("heartbeat", 200*time.Millisecond, "HeartbeatInterval and client-go's RetryPeriod")
	release := fs.String("release", string(releaseShutdown), "how this package's leader releases in a handoff: shutdown or resign")
	pgHandoff := fs.String("pg-handoff", pgHandoffPoll, "PostgreSQL handoff mode: poll, or notify (see handoffmode.go)")
	block := fs.Int("block", 5, "trials each system runs in turn before the next takes over, the order shuffled every round, so that a change in the machine's speed during the run falls on every system alike (0: each system's trials in one go, one system after another); not for parallel takeovers")
	takeoverParallel := fs.Bool("takeover-parallel", true, "run the systems' takeover trials at the same time (each waits out a TTL; the machine is idle meanwhile)")
	count := fs.Int("count", 5, "repetitions of each IsLeader benchmark (the median is reported)")
	rounds := fs.Int("rounds", 15, "rounds of the fenced-transaction comparison")
	round := fs.Duration("round", 400*time.Millisecond, "how long each side of a fenced-transaction round runs")
	pg := fs.String("postgres", cmp.Or(os.Getenv("CLUSTER_TEST_POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL DSN")
	my := fs.String("mysql", cmp.Or(os.Getenv("CLUSTER_TEST_MYSQL_DSN"), "root@tcp(127.0.0.1:3306)/test"), "MySQL/MariaDB DSN")
	out := fs.String("out", "results", "directory of the JSON results (merged by system)")
	seed := fs.Uint64("seed", 0, "seed of the random release phases (0: from the clock)")
	procs := fs.Bool("procs", false, "run each member of this package in an OS process of its own (see procs.go); the systems are then named <system>/procs")
	verbose := fs.Bool("v", false, "log each trial and the members' warnings")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ttl%time.Second != 0 {
		return fmt.Errorf("-ttl %v: etcd's session TTL and client-go's lease are whole seconds", *ttl)
	}
	mode := releaseMode(*release)
	if mode != releaseShutdown && mode != releaseResign {
		return fmt.Errorf("-release %q: want shutdown or resign", *release)
	}
	suffix, pgConfig, err := pgHandoffMode(*pgHandoff)
	if err != nil {
		return err
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	dir, err := os.MkdirTemp("", "bench-sqlite-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	r := &compareRun{
		dsns:      dsns{postgres: *pg, mysql: *my, sqliteDir: dir},
		prefix:    newPrefix(),
		tm:        timings{ttl: *ttl, heartbeat: *heartbeat},
		mode:      mode,
		pgSuffix:  suffix,
		pgConfig:  pgConfig,
		pgHandoff: *pgHandoff,
		procs:     *procs,
		verbose:   *verbose,
		out:       *out,
		rng:       rand.New(rand.NewPCG(*seed, 0x5eed)),
		targets:   map[string]target{},
	}
	defer r.cleanUp()
	fmt.Printf("compare: LeaseTTL %v, heartbeat %v, %d trials, release %s, pg-handoff %s, procs %v, seed %d, table prefix %s\n",
		r.tm.ttl, r.tm.heartbeat, *trials, mode, *pgHandoff, *procs, *seed, r.prefix)

	parts := strings.Split(*only, ",")
	names := strings.Split(*systems, ",")
	needEtcd := slices.Contains(parts, "isleader") ||
		((slices.Contains(parts, "handoff") || slices.Contains(parts, "takeover")) &&
			(slices.Contains(names, "etcd") || slices.Contains(names, "etcd/procs")))
	if needEtcd {
		if r.etcd, err = startEtcd(); err != nil {
			return err
		}
		defer r.etcd.close()
	}
	for _, part := range parts {
		var err error
		switch part {
		case "isleader":
			err = r.isLeader(ctx, *count)
		case "handoff":
			err = r.trials(ctx, handoff, strings.Split(*systems, ","), *trials, *block, false)
		case "takeover":
			err = r.trials(ctx, takeover, strings.Split(*systems, ","), *trials, *block, *takeoverParallel)
		case "fence":
			err = r.fence(ctx, strings.Split(*fenceSystems, ","), *rounds, *round)
		default:
			err = fmt.Errorf("-only: unknown measurement %q", part)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *compareRun) logf(format string, args ...any) {
	if r.verbose {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

// target returns the named target and remembers it for the clean-up.
func (r *compareRun) target(name string) (target, error) {
	tg, err := newTarget(name, r.dsns, r.prefix)
	if err != nil {
		return tg, err
	}
	r.targetsMu.Lock()
	r.targets[string(tg.dialect)] = tg
	r.targetsMu.Unlock()
	return tg, nil
}

// cleanUp drops the run's tables from every database it used.
func (r *compareRun) cleanUp() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tg := range r.targets {
		db, err := tg.openAdmin()
		if err == nil {
			err = tg.dropTables(ctx, db)
			db.Close()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "compare: drop the %s tables %s*: %v\n", tg.name, tg.prefix, err)
		}
	}
}

// newSystem builds a fresh system for one kind of trial.
func (r *compareRun) newSystem(name string, kind trialKind) (system, error) {
	switch name {
	case "client-go":
		return newClientGo(string(kind), r.tm, kind == handoff), nil
	case "etcd":
		if r.etcd == nil {
			return nil, errors.New("etcd: no embedded server")
		}
		return newEtcd(r.etcd, "/bench/"+string(kind), r.tm), nil
	case "etcd/procs":
		if r.etcd == nil {
			return nil, errors.New("etcd/procs: no embedded server")
		}
		return newEtcdProcs(r.etcd, "/bench/procs/"+string(kind), r.tm), nil
	}
	tg, err := r.target(name)
	if err != nil {
		return nil, err
	}
	// A lease of each system's own: postgres and pgx share the run's
	// tables, and their takeover trials run at the same time.
	o := sqlfenceOptions{lease: string(kind) + "-" + name, members: slots, conns: 2, tm: r.tm, mode: r.mode, log: quietLogger(r.verbose)}
	if tg.dialect == cluster.Postgres {
		o.label, o.configure = tg.name+r.pgSuffix, r.pgConfig
	}
	if r.procs {
		return newSQLFenceProcs(tg, o, r.pgHandoff, r.verbose)
	}
	return newSQLFence(tg, o)
}

// trialsResult is the JSON of results/handoff.json and takeover.json: one
// entry per system, replaced when a later run measures that system again.
type trialsResult struct {
	Kind    trialKind      `json:"kind"`
	Systems []systemTrials `json:"systems"`
}

type systemTrials struct {
	System      string   `json:"system"`
	Machine     machine  `json:"machine"`
	TTLMs       float64  `json:"ttlMs"`
	HeartbeatMs float64  `json:"heartbeatMs"`
	Release     string   `json:"release,omitempty"` // this package's handoffs: shutdown or resign
	Summary     summary  `json:"summary"`
	Overshoot   *summary `json:"overshoot,omitempty"`
	Trials      []trial  `json:"trials"`
}

// trials runs n trials of kind on each of the named systems. In parallel
// the systems run at the same time (the takeover trials, which wait out a
// TTL). Otherwise they take turns, block trials each, in a new order every
// round: each system runs alone, its members started afresh for each of
// its blocks, and a change in the machine's speed during the run (a
// virtual machine's neighbours; measured here to halve or double a p50
// within twenty seconds) falls on every system alike rather than on
// whichever ran then. block 0 runs each system's trials in one go, one
// system after another.
func (r *compareRun) trials(ctx context.Context, kind trialKind, names []string, n, block int, parallel bool) error {
	results := make([]systemTrials, len(names))
	machines := make([]machine, len(names))
	rngs := make([]*rand.Rand, len(names))
	for i := range names {
		machines[i] = newMachine()
		rngs[i] = rand.New(rand.NewPCG(r.rng.Uint64(), uint64(i)))
	}
	// run runs count more trials of system i, on members started for them.
	run := func(i, count int) error {
		sys, err := r.newSystem(names[i], kind)
		if err != nil {
			return err
		}
		defer sys.close(context.WithoutCancel(ctx))
		for slot := range sys.size() {
			if err := sys.start(ctx, slot); err != nil {
				return fmt.Errorf("%s: start member %d: %w", sys.name(), slot, err)
			}
		}
		ts, err := runTrials(ctx, sys, kind, trialOptions{
			trials: count,
			retry:  r.tm.heartbeat,
			settle: 3 * r.tm.heartbeat,
			limit:  3 * r.tm.ttl,
			rng:    rngs[i],
			log:    r.logf,
		})
		if err != nil {
			return err
		}
		st := &results[i]
		st.System, st.Trials = sys.name(), append(st.Trials, ts...)
		if _, ok := sys.(*sqlfenceSystem); ok && kind == handoff {
			st.Release = string(r.mode)
		}
		return nil
	}
	var err error
	switch {
	case parallel:
		errs := make([]error, len(names))
		var wg sync.WaitGroup
		for i := range names {
			wg.Go(func() { errs[i] = run(i, n) })
		}
		wg.Wait()
		err = errors.Join(errs...)
	case block <= 0 || block >= n || len(names) == 1:
		for i := range names {
			if err = run(i, n); err != nil {
				break
			}
		}
	default:
		for _, turn := range turns(len(names), n, block, r.rng) {
			if err = run(turn.system, turn.trials); err != nil {
				break
			}
		}
	}
	if err != nil {
		return err
	}
	for i := range results {
		machines[i].done()
		st := &results[i]
		st.Machine, st.TTLMs, st.HeartbeatMs = machines[i], ms(r.tm.ttl), ms(r.tm.heartbeat)
		var durs, over []float64
		for _, t := range st.Trials {
			durs = append(durs, t.Ms)
			if t.OvershootMs != nil {
				over = append(over, *t.OvershootMs)
			}
		}
		st.Summary = summarize(durs)
		if len(over) > 0 {
			s := summarize(over)
			st.Overshoot = &s
		}
	}
	printTrials(kind, results)
	return r.mergeTrials(kind, results)
}

// A turn is one system's block of trials.
type turn struct{ system, trials int }

// turns is the order in which systems systems take turns at n trials each,
// block at a time (the last block of each the remainder): rounds in which
// every system has one turn, in an order shuffled by rng every round.
func turns(systems, n, block int, rng *rand.Rand) []turn {
	var out []turn
	order := make([]int, systems)
	for i := range order {
		order[i] = i
	}
	for done := 0; done < n; done += block {
		rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		for _, i := range order {
			out = append(out, turn{system: i, trials: min(block, n-done)})
		}
	}
	return out
}

func printTrials(kind trialKind, rs []systemTrials) {
	fmt.Printf("\n%s (ms from the %s call to another member leading)\n\n", kind, map[trialKind]string{handoff: "release", takeover: "crash"}[kind])
	head := "| system | trials | p50 | p90 | p99 | max |"
	sep := "| --- | ---: | ---: | ---: | ---: | ---: |"
	if kind == takeover {
		head += " overshoot p50 | overshoot p99 | overshoot max |"
		sep += " ---: | ---: | ---: |"
	}
	fmt.Println(head)
	fmt.Println(sep)
	for _, r := range rs {
		s := r.Summary
		line := fmt.Sprintf("| %s | %d | %s | %s | %s | %s |", r.System, s.N, fmtMs(s.P50), fmtMs(s.P90), fmtMs(s.P99), fmtMs(s.Max))
		if kind == takeover {
			if o := r.Overshoot; o != nil {
				line += fmt.Sprintf(" %s | %s | %s |", fmtMs(o.P50), fmtMs(o.P99), fmtMs(o.Max))
			} else {
				line += " – | – | – |"
			}
		}
		fmt.Println(line)
	}
}

// mergeTrials replaces the entries of the systems measured now in the
// kind's results file, keeping the others.
func (r *compareRun) mergeTrials(kind trialKind, rs []systemTrials) error {
	name := string(kind) + ".json"
	var all trialsResult
	if err := readJSON(filepath.Join(r.out, name), &all); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	all.Kind = kind
	for _, nr := range rs {
		i := slices.IndexFunc(all.Systems, func(s systemTrials) bool { return s.System == nr.System })
		if i >= 0 {
			all.Systems[i] = nr
		} else {
			all.Systems = append(all.Systems, nr)
		}
	}
	return writeJSON(r.out, name, all)
}

// isLeaderResult is results/isleader.json.
type isLeaderResult struct {
	Machine machine         `json:"machine"`
	Count   int             `json:"count"`
	Checks  []isLeaderCheck `json:"checks"`
}

type isLeaderCheck struct {
	System   string    `json:"system"`
	Mode     string    `json:"mode"` // serial or parallel
	NsPerOp  []float64 `json:"nsPerOp"`
	Median   float64   `json:"medianNsPerOp"`
	AllocsOp int64     `json:"allocsPerOp"`
}

func (r *compareRun) isLeader(ctx context.Context, count int) error {
	checks, stop, err := leadershipChecks(ctx, r.etcd)
	if err != nil {
		return err
	}
	defer stop()
	res := isLeaderResult{Machine: newMachine(), Count: count}
	for _, c := range checks {
		for _, mode := range []string{"serial", "parallel"} {
			bench := benchSerial
			if mode == "parallel" {
				bench = benchParallel
			}
			ch := isLeaderCheck{System: c.name, Mode: mode}
			for range count {
				br := testing.Benchmark(func(b *testing.B) { bench(b, c.isLeader) })
				ch.NsPerOp = append(ch.NsPerOp, float64(br.T.Nanoseconds())/float64(br.N))
				ch.AllocsOp = br.AllocsPerOp()
			}
			ch.Median = median(ch.NsPerOp)
			r.logf("isleader %s/%s: %v ns/op", c.name, mode, ch.NsPerOp)
			res.Checks = append(res.Checks, ch)
		}
	}
	res.Machine.done()
	fmt.Printf("\nleadership check (median of %d runs of 1s)\n\n| system | serial ns/op | parallel ns/op | allocs/op |\n| --- | ---: | ---: | ---: |\n", count)
	for i := 0; i+1 < len(res.Checks); i += 2 {
		s, p := res.Checks[i], res.Checks[i+1]
		fmt.Printf("| %s | %.1f | %.1f | %d |\n", s.System, s.Median, p.Median, s.AllocsOp)
	}
	return writeJSON(r.out, "isleader.json", res)
}

// fenceResults is results/fence.json.
type fenceResults struct {
	Machine machine       `json:"machine"`
	TTLMs   float64       `json:"ttlMs"`
	Results []fenceResult `json:"results"`
}

func (r *compareRun) fence(ctx context.Context, names []string, rounds int, round time.Duration) error {
	res := fenceResults{Machine: newMachine(), TTLMs: ms(r.tm.ttl)}
	for _, name := range names {
		tg, err := r.target(name)
		if err != nil {
			return err
		}
		fr, err := benchFence(ctx, tg, fenceOptions{rounds: rounds, round: round, log: r.logf},
			sqlfenceOptions{tm: r.tm, mode: r.mode, log: quietLogger(r.verbose)})
		if err != nil {
			return fmt.Errorf("fence %s: %w", name, err)
		}
		res.Results = append(res.Results, fr)
	}
	res.Machine.done()
	fmt.Printf("\nfenced transaction (%d rounds of %v, the forms interleaved; µs per transaction)\n\n", rounds, round)
	fmt.Println("| system | each | unfenced p50 | read p50 | fenced p50 | fenced/unfenced | fenced/read | round ratios | ratio of means | unfenced p99 | fenced p99 |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, f := range res.Results {
		fmt.Printf("| %s | %d | %.0f | %.0f | %.0f | %.2f× | %.2f× | %.2f–%.2f | %.2f× | %.0f | %.0f |\n", f.System, f.Unfenced.N,
			1000*f.Unfenced.P50, 1000*f.Read.P50, 1000*f.Fenced.P50, f.MedianRatio, f.ReadRatio,
			slices.Min(f.RoundRatios), slices.Max(f.RoundRatios), f.MeanRatio, 1000*f.Unfenced.P99, 1000*f.Fenced.P99)
	}
	return writeJSON(r.out, "fence.json", res)
}
