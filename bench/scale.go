package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlfence/cluster"
)

// scalePoint is one N of a scale run: N members of this package in one
// process, each with a pool of its own, against one PostgreSQL.
type scalePoint struct {
	Via         string  `json:"via"`                 // direct or pgbouncer
	Driver      string  `json:"driver"`              // sql (database/sql over pgx's stdlib) or pgx (clusterpgx over pgxpool)
	Ping        string  `json:"ping,omitempty"`      // when the members' pools ping a connection idle for over a second: app, pgx, none (see target.ping)
	PgHandoff   string  `json:"pgHandoff,omitempty"` // notify: the followers LISTEN (direct only)
	N           int     `json:"n"`
	Conns       int     `json:"connsPerMember"`
	TTLMs       float64 `json:"ttlMs"`
	HeartbeatMs float64 `json:"heartbeatMs"`
	Machine     machine `json:"machine"`
	StartSec    float64 `json:"startSeconds"` // to start the N members

	// Load, over the window.
	WindowSec      float64            `json:"windowSeconds"`
	ServerConns    int                `json:"serverConns"`            // PostgreSQL backends of this run at the end of the window
	BaselineXactPS float64            `json:"baselineXactPerSec"`     // pg_stat_database before the members started: other load
	XactPS         float64            `json:"xactPerSec"`             // pg_stat_database during the window, all load
	ClientPS       float64            `json:"clientStatementsPerSec"` // provider calls counted by Config.Observer
	ByKindPS       map[string]float64 `json:"byKindPerSec"`
	Errors         int                `json:"errors"` // provider calls that failed in the window
	RenewLatency   summary            `json:"renewLatency"`
	AcquireLatency summary            `json:"acquireLatency"` // followers' attempts
	SelfFences     uint64             `json:"selfFences"`     // during the window
	LossesTaken    uint64             `json:"lossesTaken"`
	CPU            cpuUse             `json:"cpu"` // cores busy during the window

	Handoff        summary `json:"handoff"`
	Takeover       summary `json:"takeover"`
	Overshoot      summary `json:"overshoot"`
	HandoffTrials  []trial `json:"handoffTrials"`
	TakeoverTrials []trial `json:"takeoverTrials"`

	// Limited says what stopped this N before it completed, if anything.
	Limited string `json:"limited,omitempty"`
}

// opCounter is the members' Config.Observer: it counts provider calls and
// keeps their latencies while recording.
type opCounter struct {
	recording atomic.Bool
	mu        sync.Mutex
	counts    map[cluster.OpKind]int
	errors    int
	renew     []float64
	acquire   []float64
}

func (o *opCounter) observe(op cluster.Operation) {
	if !o.recording.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[op.Kind]++
	if op.Outcome == cluster.OutcomeError {
		o.errors++
		return
	}
	switch op.Kind {
	case cluster.OpRenew:
		o.renew = append(o.renew, ms(op.Duration))
	case cluster.OpAcquire:
		o.acquire = append(o.acquire, ms(op.Duration))
	}
}

func (o *opCounter) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts, o.errors, o.renew, o.acquire = map[cluster.OpKind]int{}, 0, nil, nil
}

const scaleAppName = "sqlfence-bench-scale"

func scale(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	via := fs.String("via", "direct", "direct, or pgbouncer: a PgBouncer of this run's own in transaction mode")
	ns := fs.String("n", "", "member counts, comma-separated (default 10,30,45 direct; 100,300,1000 through pgbouncer)")
	driver := fs.String("driver", "sql", "sql: database/sql over pgx's stdlib; pgx: clusterpgx over a pgxpool")
	conns := fs.Int("conns", 0, "connections per member's pool (default 2 direct, 1 through pgbouncer)")
	ttl := fs.Duration("ttl", 2*time.Second, "LeaseTTL")
	heartbeat := fs.Duration("heartbeat", 200*time.Millisecond, "HeartbeatInterval")
	window := fs.Duration("window", 10*time.Second, "how long load and latency are measured at each N")
	trials := fs.Int("trials", 10, "handoff and takeover trials at each N (0 for none)")
	headroom := fs.Int("headroom", 5, "PostgreSQL connections to leave free for everyone else (direct)")
	poolSize := fs.Int("pool-size", 20, "PgBouncer's server connections (default_pool_size)")
	pg := fs.String("postgres", cmp.Or(os.Getenv("CLUSTER_TEST_POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL DSN")
	out := fs.String("out", "results", "directory of the JSON results")
	name := fs.String("name", "", "the series' name: results/scale-NAME.json and the plots' legend (default: -via)")
	verbose := fs.Bool("v", false, "log progress and the members' warnings")
	ping := fs.String("ping", "app", "when the members' pools ping a PostgreSQL connection idle for over a second before reusing it: app (before the application's statements, not the provider's: clusterpgx.OpenDB, clusterpgx.ShouldPing), pgx (before every statement: stdlib.OpenDB, pgxpool's default), none")
	pgHandoff := fs.String("pg-handoff", pgHandoffPoll, "poll, or notify: the members LISTEN for releases (clusterpgx's providers; -via direct only, as a transaction pooler cannot LISTEN) and, hearing, a follower polls once per LeaseTTL")
	probe := fs.Bool("probe", false, "run a probe process beside the members (SELECT 1 through PgBouncer and directly, and 1ms sleeps) and record, for each trial, the slowest of each and the bench's own scheduling latency and GC pauses")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *via != "direct" && *via != "pgbouncer" {
		return fmt.Errorf("-via %q: want direct or pgbouncer", *via)
	}
	if *driver != "sql" && *driver != "pgx" {
		return fmt.Errorf("-driver %q: want sql or pgx", *driver)
	}
	if *ping != "app" && *ping != "pgx" && *ping != "none" {
		return fmt.Errorf("-ping %q: want app, pgx or none", *ping)
	}
	_, pgConfig, err := pgHandoffMode(*pgHandoff)
	if err != nil {
		return err
	}
	if *pgHandoff == pgHandoffNotify && *via != "direct" {
		return fmt.Errorf("-pg-handoff notify needs -via direct: LISTEN cannot work through PgBouncer in transaction mode")
	}
	if *ns == "" {
		*ns = map[string]string{"direct": "10,30,45", "pgbouncer": "100,300,1000"}[*via]
	}
	if *conns == 0 {
		*conns = map[string]int{"direct": 2, "pgbouncer": 1}[*via]
	}
	var counts []int
	for _, f := range strings.Split(*ns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("-n: %q is not a member count of at least 2", f)
		}
		counts = append(counts, n)
	}
	logf := func(format string, args ...any) {
		if *verbose {
			fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
		}
	}

	adminDSN, err := withParam(*pg, "application_name", scaleAppName+"-admin")
	if err != nil {
		return err
	}
	admin, err := sql.Open("pgx", adminDSN)
	if err != nil {
		return err
	}
	defer admin.Close()
	admin.SetMaxOpenConns(1)

	memberDSN := *pg
	var bouncer *pgBouncer
	if *via == "pgbouncer" {
		// Room for twice the members: a statement cut off by its timeout
		// closes its connection, and pgx's cancel request is a
		// connection of its own, so clients churn under overload.
		if bouncer, err = startPgBouncer(*pg, 2*slices.Max(counts)+100, *poolSize); err != nil {
			return err
		}
		defer bouncer.stop()
		if memberDSN, err = bouncer.dsn(*pg); err != nil {
			return err
		}
		logf("pgbouncer on port %d, pool %d", bouncer.port, *poolSize)
	}
	if memberDSN, err = withParam(memberDSN, "application_name", scaleAppName); err != nil {
		return err
	}

	var pr *prober
	if *probe {
		targets := map[string]string{}
		if targets["direct"], err = withParam(*pg, "application_name", scaleAppName+"-probe"); err != nil {
			return err
		}
		if bouncer != nil {
			if targets["pgbouncer"], err = withParam(memberDSN, "application_name", scaleAppName+"-probe"); err != nil {
				return err
			}
		}
		if pr, err = startProber(targets, 5*time.Millisecond); err != nil {
			return fmt.Errorf("start the probe: %w", err)
		}
		defer pr.stop()
	}

	prefix := newPrefix()
	tg := target{name: "postgres", dialect: cluster.Postgres, driver: "pgx", dsn: memberDSN, pgx: *driver == "pgx", prefix: prefix, ping: *ping}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := (target{dialect: cluster.Postgres, prefix: prefix}).dropTables(dctx, admin); err != nil {
			fmt.Fprintf(os.Stderr, "scale: drop the tables %s*: %v\n", prefix, err)
		}
	}()
	fmt.Printf("scale: via %s, driver %s, pg-handoff %s, %d connection(s) per member, LeaseTTL %v, heartbeat %v, window %v, %d trials, N = %v, table prefix %s\n",
		*via, *driver, *pgHandoff, *conns, *ttl, *heartbeat, *window, *trials, counts, prefix)

	var points []scalePoint
	for _, n := range counts {
		p := scalePoint{Via: *via, Driver: *driver, Ping: *ping, PgHandoff: *pgHandoff, N: n, Conns: *conns, TTLMs: ms(*ttl), HeartbeatMs: ms(*heartbeat), WindowSec: window.Seconds()}
		if *via == "direct" {
			if err := checkHeadroom(ctx, admin, n**conns+1, *headroom); err != nil {
				p.Limited = err.Error()
				points = append(points, p)
				fmt.Printf("N=%d: skipped: %v\n", n, err)
				continue
			}
		}
		setup := scaleSetup{tg: tg, admin: admin, tm: timings{*ttl, *heartbeat}, window: *window, trials: *trials, verbose: *verbose, logf: logf, probe: pr, configure: pgConfig}
		if bouncer != nil {
			setup.bouncerPid = bouncer.cmd.Process.Pid
		}
		err := scaleOne(ctx, &p, setup)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			p.Limited = err.Error()
			if bouncer != nil {
				p.Limited += "; pgbouncer log: " + bouncer.logTail(3)
			}
			fmt.Printf("N=%d: did not complete: %v\n", n, err)
		}
		points = append(points, p)
	}
	printScale(points)
	// Merge by N into the series' file, so an N run later (when the server
	// has room for it) joins the others.
	series := cmp.Or(*name, *via)
	file := "scale-" + series + ".json"
	all := scaleResult{Name: series}
	if err := readJSON(filepath.Join(*out, file), &all); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, p := range points {
		i := slices.IndexFunc(all.Points, func(q scalePoint) bool { return q.N == p.N })
		switch {
		case i < 0:
			all.Points = append(all.Points, p)
		case p.ClientPS > 0 || all.Points[i].ClientPS == 0:
			all.Points[i] = p // a point skipped now does not replace one measured before
		}
	}
	slices.SortFunc(all.Points, func(a, b scalePoint) int { return cmp.Compare(a.N, b.N) })
	return writeJSON(*out, file, all)
}

type scaleResult struct {
	Name   string       `json:"name"`
	Points []scalePoint `json:"points"`
}

type scaleSetup struct {
	bouncerPid int
	tg         target
	admin      *sql.DB
	tm         timings
	window     time.Duration
	trials     int
	verbose    bool
	logf       func(string, ...any)
	probe      *prober // nil without -probe
	configure  func(*cluster.Config) error
}

// scaleOne measures one N: start, a window of steady load, then handoff
// and takeover trials, then stop.
func scaleOne(ctx context.Context, p *scalePoint, s scaleSetup) error {
	p.Machine = newMachine()
	defer p.Machine.done()
	counter := &opCounter{}
	counter.reset()

	// Other load first: the database's transaction rate before we start.
	base, err := xactRate(ctx, s.admin, 3*time.Second)
	if err != nil {
		return err
	}
	p.BaselineXactPS = base

	sys, err := newSQLFence(s.tg, sqlfenceOptions{
		lease: fmt.Sprintf("scale%d", p.N), members: p.N, conns: p.Conns, tm: s.tm,
		mode: releaseShutdown, log: quietLogger(s.verbose), observer: counter.observe, configure: s.configure,
	})
	if err != nil {
		return err
	}
	defer func() {
		start := time.Now()
		sys.close(context.WithoutCancel(ctx))
		s.logf("N=%d: stopped in %v", p.N, time.Since(start).Round(time.Millisecond))
	}()

	start := time.Now()
	if err := startMembers(ctx, sys, p.N); err != nil {
		return fmt.Errorf("start %d members: %w", p.N, err)
	}
	p.StartSec = time.Since(start).Seconds()
	s.logf("N=%d: started in %.1fs", p.N, p.StartSec)
	if _, err := waitLeader(ctx, sys, 5*s.tm.ttl); err != nil {
		return err
	}
	// Let the followers settle into their cycle before measuring, and let
	// every backend report the start's transactions: PostgreSQL 15 flushes
	// an idle backend's counts up to 10s late (PGSTAT_IDLE_INTERVAL), and a
	// listening member's connections sit idle for a LeaseTTL at a time.
	if err := sleep(ctx, max(11*time.Second, 5*s.tm.heartbeat)); err != nil {
		return err
	}

	fences0, taken0 := memberLosses(sys)
	x0, err := xactCount(ctx, s.admin)
	if err != nil {
		return err
	}
	pids, err := backendPids(ctx, s.admin)
	if err != nil {
		return err
	}
	cpu0 := takeCPU(s.bouncerPid, pids)
	counter.reset()
	counter.recording.Store(true)
	wstart := time.Now()
	if err := sleep(ctx, s.window); err != nil {
		return err
	}
	counter.recording.Store(false)
	p.CPU = cpu0.use(takeCPU(s.bouncerPid, pids))
	elapsed := time.Since(wstart).Seconds()
	x1, err := xactCount(ctx, s.admin)
	if err != nil {
		return err
	}
	fences1, taken1 := memberLosses(sys)
	p.XactPS = float64(x1-x0) / elapsed
	p.SelfFences, p.LossesTaken = fences1-fences0, taken1-taken0
	if p.ServerConns, err = serverConns(ctx, s.admin); err != nil {
		return err
	}
	counter.mu.Lock()
	total := 0
	p.ByKindPS = map[string]float64{}
	for k, c := range counter.counts {
		total += c
		p.ByKindPS[string(k)] = float64(c) / elapsed
	}
	p.ClientPS = float64(total) / elapsed
	p.Errors = counter.errors
	p.RenewLatency, p.AcquireLatency = summarize(counter.renew), summarize(counter.acquire)
	counter.mu.Unlock()
	s.logf("N=%d: %.0f statements/s by the client, %.0f xact/s at the server (%.0f before), renew p50 %.2fms p99 %.2fms, %d errors, %d self-fences; cores busy: bench %.2f, pgbouncer %.2f, backends %.2f, machine %.2f",
		p.N, p.ClientPS, p.XactPS, p.BaselineXactPS, p.RenewLatency.P50, p.RenewLatency.P99, p.Errors, p.SelfFences,
		p.CPU.Bench, p.CPU.PgBouncer, p.CPU.Backends, p.CPU.Machine)

	if s.trials == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(p.N)))
	opts := trialOptions{trials: s.trials, retry: s.tm.heartbeat, settle: 3 * s.tm.heartbeat, limit: 5 * s.tm.ttl, rng: rng, log: s.logf}
	if s.probe != nil {
		opts.around = func() func(*trial) {
			before := readRuntimeStalls()
			return func(t *trial) {
				sched, gc := before.worstSince(readRuntimeStalls())
				t.Stalls = &trialStalls{SchedMs: sched, GCPauseMs: gc}
			}
		}
		defer func() {
			// The probe's samples of the last trial may still be in flight.
			time.Sleep(200 * time.Millisecond)
			for _, ts := range [][]trial{p.HandoffTrials, p.TakeoverTrials} {
				for i := range ts {
					if t := &ts[i]; t.Stalls != nil {
						t.Stalls.ProbeMs = s.probe.worst(t.from, t.to)
						s.logf("N=%d trial %7.1fms: probe's slowest %v; bench sched <= %.1fms, gc pause <= %.1fms", p.N, t.Ms, t.Stalls.ProbeMs, t.Stalls.SchedMs, t.Stalls.GCPauseMs)
					}
				}
			}
		}()
	}
	if p.HandoffTrials, err = runTrials(ctx, sys, handoff, opts); err != nil {
		return fmt.Errorf("handoff: %w", err)
	}
	if p.TakeoverTrials, err = runTrials(ctx, sys, takeover, opts); err != nil {
		return fmt.Errorf("takeover: %w", err)
	}
	var h, t, o []float64
	for _, tr := range p.HandoffTrials {
		h = append(h, tr.Ms)
	}
	for _, tr := range p.TakeoverTrials {
		t = append(t, tr.Ms)
		if tr.OvershootMs != nil {
			o = append(o, *tr.OvershootMs)
		}
	}
	p.Handoff, p.Takeover, p.Overshoot = summarize(h), summarize(t), summarize(o)
	return nil
}

// startMembers starts the first member alone (it creates the tables),
// then the others a few at a time.
func startMembers(ctx context.Context, sys *sqlfenceSystem, n int) error {
	if err := sys.start(ctx, 0); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	sem := make(chan struct{}, 8)
	for slot := 1; slot < n; slot++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[slot] = sys.start(ctx, slot)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func memberLosses(sys *sqlfenceSystem) (selfFences, taken uint64) {
	for slot := range sys.size() {
		if c := sys.cluster(slot); c != nil {
			st := c.Stats()
			selfFences += st.SelfFences
			taken += st.LossesTaken
		}
	}
	return selfFences, taken
}

// checkHeadroom refuses a run that would leave fewer than headroom of
// max_connections free for everyone else sharing the server.
func checkHeadroom(ctx context.Context, admin *sql.DB, need, headroom int) error {
	var maxConns, used int
	err := admin.QueryRowContext(ctx, `SELECT current_setting('max_connections')::int,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')`).Scan(&maxConns, &used)
	if err != nil {
		return err
	}
	if used+need > maxConns-headroom {
		return fmt.Errorf("%d connections needed, %d in use of max_connections %d: would leave fewer than %d free (-headroom)", need, used, maxConns, headroom)
	}
	return nil
}

// xactCount is the database's committed and rolled-back transactions so
// far, as pg_stat_database shows them. A busy backend flushes its counts
// at most once a second, an idle one within 10s, so a window is right
// within about 10s of load at either end: use -window 30s or more for a
// listening member's small rates.
func xactCount(ctx context.Context, admin *sql.DB) (int64, error) {
	var n int64
	err := admin.QueryRowContext(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()").Scan(&n)
	return n, err
}

func xactRate(ctx context.Context, admin *sql.DB, d time.Duration) (float64, error) {
	x0, err := xactCount(ctx, admin)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := sleep(ctx, d); err != nil {
		return 0, err
	}
	x1, err := xactCount(ctx, admin)
	if err != nil {
		return 0, err
	}
	// The two reads are transactions too.
	return float64(x1-x0-1) / time.Since(start).Seconds(), nil
}

// backendPids are the PostgreSQL backends serving the members.
func backendPids(ctx context.Context, admin *sql.DB) ([]int, error) {
	rows, err := admin.QueryContext(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", scaleAppName)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, rows.Err()
}

func serverConns(ctx context.Context, admin *sql.DB) (int, error) {
	var n int
	err := admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", scaleAppName).Scan(&n)
	return n, err
}

func withParam(dsn, key, value string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func printScale(points []scalePoint) {
	fmt.Printf("\n| via | N | conns | server conns | client stmts/s | server xact/s (before) | renew p50 | renew p99 | acquire p50 | acquire p99 | errors | self-fences | handoff p50 | handoff p99 | takeover p50 | takeover p99 | cores: bench, pgbouncer, backends, machine |\n")
	fmt.Printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, p := range points {
		if p.Limited != "" && p.ClientPS == 0 {
			fmt.Printf("| %s | %d | %d | – | – | – | – | – | – | – | – | – | – | – | – | – | – |\n", p.Via, p.N, p.Conns)
			continue
		}
		fmt.Printf("| %s | %d | %d | %d | %.0f | %.0f (%.0f) | %s | %s | %s | %s | %d | %d | %s | %s | %s | %s | %.2f, %.2f, %.2f, %.2f |\n",
			p.Via, p.N, p.Conns, p.ServerConns, p.ClientPS, p.XactPS, p.BaselineXactPS,
			fmtMs(p.RenewLatency.P50), fmtMs(p.RenewLatency.P99), fmtMs(p.AcquireLatency.P50), fmtMs(p.AcquireLatency.P99),
			p.Errors, p.SelfFences, fmtMs(p.Handoff.P50), fmtMs(p.Handoff.P99), fmtMs(p.Takeover.P50), fmtMs(p.Takeover.P99),
			p.CPU.Bench, p.CPU.PgBouncer, p.CPU.Backends, p.CPU.Machine)
	}
	for _, p := range points {
		if p.Limited != "" {
			fmt.Printf("\nN=%d limited: %s\n", p.N, p.Limited)
		}
	}
}
