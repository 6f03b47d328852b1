package main

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sqlfence/cluster"
)

// An experiment is one seeded run against one dialect.
type experiment struct {
	Dialect     cluster.Dialect
	Stack       string // how nodes reach the database (stackSQL, or stackPgx on PostgreSQL)
	DSN         string // server DSN (PostgreSQL, MySQL)
	Seed        uint64
	Duration    time.Duration // of the nemesis schedule
	Nodes       int
	Timings     timings
	Pause       time.Duration // between writes
	StaleWrites int
	Lanes       int // lane keys of the lanes workload (0: none)
	Mutant      string
	Kinds       []string // fault kinds; empty means all the dialect takes
	LeaderShare float64  // probability a fault aims at the leader
	Cover       bool     // draw every fault kind at least once (see schedule)
	Dir         string   // where histories and logs go
	Log         io.Writer
}

// A fault as it happened.
type fault struct {
	Kind   string
	Node   string
	Detail string
	Start  int64  // experiment time
	End    int64  // the heal; Start for instant faults
	Token  uint64 `json:",omitempty"` // release: the term it ended
}

// proc is one node: its process (restarted under a new incarnation after a
// kill) and its proxy.
type proc struct {
	id      string
	idx     int
	inc     int
	proxy   *proxy
	dsn     string
	cmd     *exec.Cmd
	done    chan struct{}
	stopped bool        // SIGSTOPped
	ending  atomic.Bool // the harness is ending this incarnation
	offset  time.Duration
	files   []string // history files, one per incarnation
}

// harness runs one experiment.
type harness struct {
	e      *experiment
	origin int64
	clk    *clock
	tg     target
	db     *sql.DB
	probe  *sql.DB // SQLite: the pool that tells whether the write lock is held
	lp     *cluster.DBProvider
	procs  []*proc
	faults []fault
	exe    string

	mu      sync.Mutex
	crashes []string // processes that exited when the harness did not end them
}

// label names the experiment's dialect and, when not database/sql, its
// stack: "postgres+pgx".
func (e *experiment) label() string {
	if e.Stack == stackSQL {
		return string(e.Dialect)
	}
	return string(e.Dialect) + "+" + e.Stack
}

func (e *experiment) logf(format string, args ...any) {
	if e.Log != nil {
		fmt.Fprintf(e.Log, format+"\n", args...)
	}
}

// run runs the experiment and checks it.
func (e *experiment) run(ctx context.Context) (*result, error) {
	if e.Nodes < 1 {
		return nil, fmt.Errorf("nodes (%d) must be at least 1", e.Nodes)
	}
	kinds := e.Kinds
	if len(kinds) == 0 {
		kinds = faultKinds(e.Dialect, e.Stack)
	}
	if err := allowed(e.Dialect, e.Stack, kinds); err != nil {
		return nil, err
	}
	if ok := e.Stack == stackSQL || e.Stack == stackPgx && e.Dialect == cluster.Postgres; !ok {
		return nil, fmt.Errorf("stack %q is not available on %s (the pgx stack needs PostgreSQL, the open stack MySQL)", e.Stack, e.Dialect)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(e.Dir, 0o755); err != nil {
		return nil, err
	}
	var rb [4]byte
	crand.Read(rb[:])
	prefix := "chaos" + hex.EncodeToString(rb[:]) + "_"
	tg, err := newTarget(e.Dialect, e.DSN, e.Dir, prefix)
	if err != nil {
		return nil, err
	}
	origin := monotonicNow()
	h := &harness{e: e, origin: origin, clk: newClock(origin), tg: tg, exe: exe}
	if h.db, err = tg.open(tg.dsn); err != nil {
		return nil, err
	}
	defer h.db.Close()
	if h.probe, err = tg.openProbe(); err != nil {
		return nil, err
	}
	if h.probe != nil {
		defer h.probe.Close()
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := tg.drop(dctx, h.db); err != nil {
			e.logf("drop %s tables: %v", prefix, err)
		}
	}()
	if err := h.prepare(ctx); err != nil {
		return nil, err
	}
	// The stream is the label's length: the database/sql stacks keep the
	// schedules their seeds always had.
	plan := schedule(rand.New(rand.NewPCG(e.Seed, uint64(len(e.label())))), kinds, e.Nodes, e.Timings, e.Duration, e.LeaderShare, e.Cover)
	defer h.teardown()
	for i := range e.Nodes {
		p := &proc{id: fmt.Sprintf("n%d", i+1), idx: i}
		if tg.networked() {
			addr, err := tg.serverAddr()
			if err != nil {
				return nil, err
			}
			if p.proxy, err = newProxy(addr, e.Seed+uint64(i)); err != nil {
				return nil, err
			}
			if p.dsn, err = tg.nodeDSN(p.id, p.proxy.addr); err != nil {
				return nil, err
			}
		} else {
			p.dsn = tg.dsn
		}
		h.procs = append(h.procs, p)
		if err := h.start(p); err != nil {
			return nil, err
		}
	}
	h.waitLeader(ctx, 15*time.Second)
	start := h.clk.now()
	e.logf("%s: %d nodes up, prefix %s; %d faults planned over %v", e.label(), e.Nodes, prefix, len(plan), e.Duration)
	for _, s := range plan {
		if err := h.apply(ctx, s); err != nil {
			return nil, err
		}
	}
	// Let the cluster settle: a leader, and a few writes under it.
	h.healAll()
	h.waitLeader(ctx, e.Timings.TTL+2*e.Timings.Heartbeat+5*time.Second)
	sleepCtx(ctx, 2*e.Timings.TTL)
	end := h.clk.now()
	h.stopAll()
	fin, err := h.final(ctx)
	if err != nil {
		return nil, fmt.Errorf("read final state: %w", err)
	}
	hist := map[string][]record{}
	for _, p := range h.procs {
		for i, f := range p.files {
			rs, err := readHistory(f)
			if err != nil {
				return nil, err
			}
			hist[fmt.Sprintf("%s.%d", p.id, i+1)] = rs
		}
	}
	in := checkInput{dialect: e.Dialect, stack: e.Stack, timings: e.Timings, histories: hist, faults: h.faults, final: fin,
		start: start, end: end, dir: e.Dir}
	res := check(in)
	h.mu.Lock()
	for _, c := range h.crashes {
		res.add(aCrash, "%s", c)
	}
	h.mu.Unlock()
	res.Seed, res.Duration, res.Nodes, res.Mutant, res.Plan, res.Stack = e.Seed, e.Duration, e.Nodes, e.Mutant, len(plan), e.Stack
	return res, nil
}

// prepare creates the cluster's tables (with the library's own DDL) and
// the workload's, and applies the tip-guard mutant.
func (h *harness) prepare(ctx context.Context) error {
	var err error
	if h.lp, err = cluster.NewDBProvider(h.db, h.tg.dialect, h.tg.prefix); err != nil {
		return err
	}
	if err := h.lp.Init(ctx); err != nil {
		return fmt.Errorf("create the cluster tables: %w", err)
	}
	if err := h.tg.createWorkload(ctx, h.db); err != nil {
		return fmt.Errorf("create the workload tables: %w", err)
	}
	if h.e.Mutant == mutantTipGuard {
		return h.tg.dropTipGuard(ctx, h.db)
	}
	return nil
}

// start starts the next incarnation of p.
func (h *harness) start(p *proc) error {
	p.inc++
	base := filepath.Join(h.e.Dir, fmt.Sprintf("%s.%d", p.id, p.inc))
	cfg := nodeConfig{
		ID: p.id, Incarnation: p.inc, Dialect: h.tg.dialect, Driver: h.tg.driver, DSN: p.dsn, Prefix: h.tg.prefix,
		History: base + ".jsonl", Witness: filepath.Join(h.e.Dir, p.id+".witness"), Origin: h.origin,
		TTL: h.e.Timings.TTL, Heartbeat: h.e.Timings.Heartbeat, FenceTimeout: h.e.Timings.FenceTimeout,
		Pause: h.e.Pause, StaleWrites: h.e.StaleWrites, WallOffset: p.offset, Mutant: h.e.Mutant, Stack: h.e.Stack, Lanes: h.e.Lanes,
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	logf, err := os.Create(base + ".log")
	if err != nil {
		return err
	}
	cmd := exec.Command(h.exe)
	cmd.Env = append(os.Environ(), envNode+"="+string(raw))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	p.cmd, p.done, p.stopped = cmd, make(chan struct{}), false
	p.ending.Store(false)
	p.files = append(p.files, cfg.History)
	done, name := p.done, fmt.Sprintf("%s.%d", p.id, p.inc)
	go func() {
		err := cmd.Wait()
		logf.Close()
		if !p.ending.Load() {
			h.mu.Lock()
			h.crashes = append(h.crashes, fmt.Sprintf("%s exited at %s on its own: %v (see %s.log)", name, sec(h.clk.now()), err, base))
			h.mu.Unlock()
		}
		close(done)
	}()
	return nil
}

func (p *proc) alive() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig syscall.Signal) {
	if p.alive() {
		p.cmd.Process.Signal(sig)
	}
}

// kill ends p with SIGKILL and waits for it.
func (p *proc) kill() {
	if !p.alive() {
		return
	}
	p.ending.Store(true)
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	p.stopped = false
}

// terminate asks p to shut down cleanly, and kills it after grace.
func (p *proc) terminate(grace time.Duration) {
	if !p.alive() {
		return
	}
	p.ending.Store(true)
	if p.stopped {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.stopped = false
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
}

// leader returns the node the lease row names, if its term is unexpired.
func (h *harness) leader(ctx context.Context) *proc {
	lctx, cancel := context.WithTimeout(ctx, h.e.Timings.Heartbeat)
	defer cancel()
	l, err := h.lp.Leader(lctx, "leader")
	if err != nil || l == nil {
		return nil
	}
	id, _, _ := strings.Cut(l.NodeID, "~")
	for _, p := range h.procs {
		if p.id == id {
			return p
		}
	}
	return nil
}

func (h *harness) waitLeader(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if h.leader(ctx) != nil {
			return
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// apply runs one step of the schedule: the quiet time, the fault, its
// hold and its heal.
func (h *harness) apply(ctx context.Context, s step) error {
	if !sleepCtx(ctx, s.Rest) {
		return ctx.Err()
	}
	p := h.procs[s.Fallback]
	if s.Leader {
		if l := h.leader(ctx); l != nil {
			p = l
		}
	}
	f := fault{Kind: s.Kind, Node: p.id, Detail: s.String(), Start: h.clk.now()}
	h.e.logf("  %6.1fs %s -> %s", float64(f.Start)/1e9, s, p.id)
	switch s.Kind {
	case faultKill, faultRestart:
		p.kill()
		sleepCtx(ctx, s.Hold)
		if err := h.start(p); err != nil {
			return err
		}
	case faultPause:
		if p.alive() {
			if undone := h.stop(ctx, p); undone > 0 {
				f.Detail += fmt.Sprintf(" (%d stops inside a write undone)", undone)
				if undone == 20 {
					h.e.logf("          %s: 20 stops landed inside a write transaction and were undone; the 21st stays, inside one or not", p.id)
				} else {
					h.e.logf("          %s: %d stops landed inside a write transaction and were undone", p.id, undone)
				}
			}
			f.Start = h.clk.now()
		}
		sleepCtx(ctx, s.Hold)
		if p.stopped {
			p.signal(syscall.SIGCONT)
			p.stopped = false
		}
	case faultPartition:
		p.proxy.blackhole(s.Up, s.Down)
		sleepCtx(ctx, s.Hold)
		p.proxy.heal()
	case faultLatency:
		p.proxy.slow(s.Delay, s.Jitter)
		sleepCtx(ctx, s.Hold)
		p.proxy.heal()
	case faultSlowCut:
		p.proxy.slow(s.Delay, s.Jitter)
		if sleepCtx(ctx, s.Cut) {
			p.proxy.blackhole(true, true)
			sleepCtx(ctx, s.Hold-s.Cut)
		}
		p.proxy.heal()
	case faultReset:
		f.Detail += fmt.Sprintf(" (%d connections)", p.proxy.reset())
	case faultDBKill:
		kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := h.tg.killSessions(kctx, h.db, p.id, p.proxy.serverPorts())
		cancel()
		if err != nil {
			f.Detail += " (failed: " + err.Error() + ")"
		} else {
			f.Detail += fmt.Sprintf(" (%d sessions)", n)
		}
	case faultRelease:
		// The term of the lease row, whoever holds it: the step aimed at
		// the leader, and an operator ends the term clusterctl showed.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := h.lp.Leader(rctx, "leader")
		switch {
		case err != nil:
			f.Detail += " (failed: " + err.Error() + ")"
		case l == nil:
			f.Detail += " (no term to end)"
		default:
			// The token is recorded even when the call failed: its
			// statement may have committed.
			ok, err := h.lp.ForceRelease(rctx, "leader", l.FencingToken)
			f.Node, _, _ = strings.Cut(l.NodeID, "~")
			f.Token = l.FencingToken
			switch {
			case err != nil:
				f.Detail += fmt.Sprintf(" (token %d: %v)", l.FencingToken, err)
			case ok:
				f.Detail += fmt.Sprintf(" (token %d)", l.FencingToken)
			default:
				f.Detail += fmt.Sprintf(" (token %d: already over)", l.FencingToken)
			}
		}
		cancel()
		sleepCtx(ctx, s.Hold)
	case faultResign:
		if p.alive() && !p.stopped {
			p.signal(syscall.SIGUSR1)
		}
		sleepCtx(ctx, s.Hold)
	case faultClock:
		p.terminate(10 * time.Second)
		p.offset = s.Offset
		if err := h.start(p); err != nil {
			return err
		}
	}
	f.End = h.clk.now()
	h.faults = append(h.faults, f)
	return ctx.Err()
}

// stop sends p SIGSTOP. On SQLite a process stopped inside a write
// transaction keeps the file's write lock, so no other node can take the
// lease until it runs again and the pause tests nothing a takeover could
// get wrong (with the faults aimed at the leader, CI saw both of a run's
// pauses land so and a mutant escape). There the stop is undone and tried
// again a few milliseconds later while the lock stays held, up to 20
// times; stop returns how many stops it undid.
func (h *harness) stop(ctx context.Context, p *proc) int {
	undone := 0
	for {
		p.signal(syscall.SIGSTOP)
		p.stopped = true
		if h.probe == nil || undone == 20 || !h.lockHeld(ctx) {
			return undone
		}
		p.signal(syscall.SIGCONT)
		p.stopped = false
		undone++
		sleepCtx(ctx, time.Duration(5+rand.IntN(20))*time.Millisecond)
	}
}

// lockHeld reports whether SQLite's write lock stays held for 30ms: a
// running node's transaction lasts a few milliseconds, a stopped one's
// until it runs again.
func (h *harness) lockHeld(ctx context.Context) bool {
	for i := 0; i < 4; i++ {
		if i > 0 && !sleepCtx(ctx, 10*time.Millisecond) {
			return false
		}
		held, err := h.tg.writeLocked(ctx, h.probe)
		if err != nil {
			h.e.logf("probe the write lock: %v", err)
			return false
		}
		if !held {
			return false
		}
	}
	return true
}

// healAll ends every fault still in force and restarts dead nodes.
func (h *harness) healAll() {
	for _, p := range h.procs {
		if p.proxy != nil {
			p.proxy.heal()
		}
		if p.stopped {
			p.signal(syscall.SIGCONT)
			p.stopped = false
		}
		if !p.alive() {
			h.start(p)
		}
	}
}

// stopAll shuts every node down cleanly, all at once.
func (h *harness) stopAll() {
	for _, p := range h.procs {
		p.ending.Store(true)
		if p.stopped {
			p.signal(syscall.SIGCONT)
			p.stopped = false
		}
		p.signal(syscall.SIGTERM)
	}
	for _, p := range h.procs {
		p.terminate(15 * time.Second)
	}
}

func (h *harness) teardown() {
	for _, p := range h.procs {
		p.kill()
		if p.proxy != nil {
			p.proxy.close()
		}
	}
}

// sleepCtx sleeps for d or until ctx ends, and reports whether it slept.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// The final state of the database, read after every node stopped.
type finalState struct {
	Writes     []dbWrite
	Audit      []dbAudit
	Tip        *dbTip
	LeaseToken int64
	HighWater  int64
	// ConfigVersion is the config version of lease name "leader" (0 when
	// it has no row).
	ConfigVersion int64
	// Terms is the term log (see target.createTermLog), in counter order.
	Terms []dbTerm
	// LaneWrites are the lanes workload's rows, in counter order.
	LaneWrites []dbWrite
}

// A dbTerm is one row of the term log: a change of the lease row (Lane
// empty) or of a lane's row that granted a term or a claim, or ended one,
// at its place in the counter's order.
type dbTerm struct {
	Seq              int64
	Lane             string `json:",omitempty"`
	Token            int64
	Holder, Instance string
	Ended            bool
}

type dbWrite struct {
	Seq   int64
	Token int64
	Op    string
	Lane  string `json:",omitempty"` // a lane write's key
}

type dbAudit struct {
	Counter int64
	Hash    []byte
	Payload string
}

type dbTip struct {
	Counter int64
	Hash    []byte
	Token   int64
}

// queryAll runs q and scans every row into a T; an error of the
// iteration (a connection lost mid-read) is an error, not a short list.
func queryAll[T any](ctx context.Context, db *sql.DB, q string, scan func(*sql.Rows, *T) error) ([]T, error) {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := scan(rows, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func (h *harness) final(ctx context.Context) (*finalState, error) {
	d, p := h.tg.dialect, h.tg.prefix
	fs := &finalState{}
	var err error
	if fs.Writes, err = queryAll(ctx, h.db, "SELECT seq, token, op FROM "+p+"writes ORDER BY seq", func(r *sql.Rows, w *dbWrite) error {
		return r.Scan(&w.Seq, &w.Token, &w.Op)
	}); err != nil {
		return nil, err
	}
	if fs.Audit, err = queryAll(ctx, h.db, "SELECT monotonic_counter, row_hash, payload FROM "+p+"audit ORDER BY monotonic_counter", func(r *sql.Rows, a *dbAudit) error {
		return r.Scan(&a.Counter, &a.Hash, &a.Payload)
	}); err != nil {
		return nil, err
	}
	if fs.Terms, err = queryAll(ctx, h.db, "SELECT seq, lane, token, holder, instance, ended FROM "+h.tg.termsTable()+" ORDER BY seq", func(r *sql.Rows, t *dbTerm) error {
		return r.Scan(&t.Seq, &t.Lane, &t.Token, &t.Holder, &t.Instance, &t.Ended)
	}); err != nil {
		return nil, err
	}
	if fs.LaneWrites, err = queryAll(ctx, h.db, "SELECT seq, token, op, lane FROM "+p+"lanewrites ORDER BY seq", func(r *sql.Rows, w *dbWrite) error {
		return r.Scan(&w.Seq, &w.Token, &w.Op, &w.Lane)
	}); err != nil {
		return nil, err
	}
	var t dbTip
	err = h.db.QueryRowContext(ctx, bind(d, "SELECT at_counter, row_hash, fencing_token FROM "+p+"chain_tips WHERE scope = ?"), chainName).Scan(&t.Counter, &t.Hash, &t.Token)
	switch {
	case err == nil:
		fs.Tip = &t
	case !errors.Is(err, sql.ErrNoRows):
		return nil, err
	}
	// No lease row, no mark: no term was ever granted (the checker says
	// so: no progress).
	if err := h.db.QueryRowContext(ctx, bind(d, "SELECT fencing_token FROM "+p+"lease WHERE name = ?"), "leader").Scan(&fs.LeaseToken); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	if err := h.db.QueryRowContext(ctx, bind(d, "SELECT config_version FROM "+p+"config WHERE scope = ?"), "leader").Scan(&fs.ConfigVersion); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	if err := h.db.QueryRowContext(ctx, bind(d, "SELECT value FROM "+p+"high_water WHERE scope = ?"), "lease/leader").Scan(&fs.HighWater); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	return fs, nil
}
