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
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sqlfence/cluster"
)

// The failover experiment (PostgreSQL): a primary and an asynchronous
// standby of its own, the standby's replication connection through a proxy
// of the harness. Nodes lead and write on the primary; the harness
// blackholes the replication connection, so that what follows is certainly
// not on the standby: a burst of commits, and leaders shut down one after
// another so that new terms are granted. Then the primary crashes
// (immediate shutdown), the standby is promoted, and the nodes are started
// again on it, after a new node whose witness file starts empty. The last
// acquisitions and writes are lost; every node whose witness file recorded
// more than the promoted database holds must refuse to lead on it.

// A failoverExperiment is one seeded run of the failover experiment.
type failoverExperiment struct {
	Seed      uint64
	Nodes     int // nodes that run before the failover, each with its witness file
	Timings   timings
	Pause     time.Duration // between a leader's writes
	Handovers int           // leaders shut down during the lag, each a lost acquisition
	PGBin     string        // directory of initdb, postgres, pg_ctl, pg_basebackup ("": found)
	Dir       string        // histories and logs
	Log       io.Writer
}

// Fault kinds of the failover experiment.
const (
	faultLag          = "replication-lag" // the standby's replication connection blackholed, until the primary is gone
	faultLeaderStop   = "leader-stop"     // the leader shuts down cleanly (its lease released), restarted after the next grant
	faultPrimaryCrash = "primary-crash"   // the primary's immediate shutdown (SIGQUIT to the postmaster), then the standby's promotion
)

// Anomaly kinds of the failover experiment.
const (
	aNoLoss         = "no-loss"                  // the promoted standby holds every grant: nothing was tested
	aWitnessMissed  = "witness-missed"           // a node's witness file lacks a token the node was granted
	aLedRolledBack  = "led-on-rolled-back-db"    // a node whose witness saw more than the promoted database led, or committed, on it
	aUndetected     = "rollback-undetected"      // such a node started on the promoted database without ErrRollbackDetected
	aNoLeaderAfter  = "no-leader-after-failover" // the new node never led on the promoted database
	aFailoverWrites = "write-after-failover"     // an acknowledged write on the promoted database is missing, or a failed one is there
	aFalseRollback  = "false-rollback-detected"  // ErrRollbackDetected for an inconsistency within the promoted database, which has none
)

// A nodeView is what one node saw before the failover, by its witness file
// and its history, and what it did on the promoted database.
type nodeView struct {
	Node     string
	Token    uint64 // the witness file's highest fencing token
	Counter  int64  // the witness file's chain tip counter
	Granted  uint64 // the highest token granted to the node on the primary (its history)
	Saw      bool   // the witness file records more than the promoted database holds
	Refusals int    // New failures with ErrRollbackDetected against the witness file, on the promoted database
	Refusal  string // the first one's message
	False    int    // New failures with ErrRollbackDetected for an inconsistency within the database
	FalseMsg string // the first one's message
	Other    string // the first other New failure, if any
	Grants   []uint64
	Writes   int // writes acknowledged on the promoted database
}

// failoverResult is what the failover experiment found.
type failoverResult struct {
	Seed      uint64
	Timings   timings
	Server    string // server_version
	Writes    int    // write operations invoked, all phases
	Outcomes  map[string]int
	Faults    map[string]int
	FaultList []fault

	CaughtUp   int   // rows on the standby when the lag began
	WALBehind  int64 // bytes of WAL the standby had not replayed at the crash (at least)
	BeforeTop  uint64
	BeforeBy   string
	LostGrants []grant // granted on the primary, above the promoted database's token
	AckedOld   int     // writes acknowledged on the primary
	LostWrites int     // of which missing on the promoted database

	PromotedToken   uint64
	PromotedCounter int64
	PromotedRows    int

	Views        []nodeView // the nodes with a witness from before the failover
	Fresh        nodeView   // the new node
	FirstAfter   uint64     // the first token granted on the promoted database
	FirstAfterBy string
	Reused       []uint64 // tokens granted on the promoted database that the primary had granted
	ReusedWrites int      // writes acknowledged on the promoted database under a reused token
	HandoverTo   string   // who led after the new node shut down, if anyone

	Anomalies []anomaly
}

func (r *failoverResult) add(kind, format string, args ...any) {
	r.Anomalies = append(r.Anomalies, anomaly{Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// run runs the failover experiment and checks it. The servers and their
// files are removed when it returns, whatever happened.
func (e *failoverExperiment) run(ctx context.Context) (res *failoverResult, err error) {
	bin, err := findPGBin(e.PGBin)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoPostgres, err)
	}
	as, err := serverUser()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoPostgres, err)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(e.Dir, 0o755); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(e.Seed, 0xfa11))
	// The servers' files live apart from the histories: their directory
	// must belong to the servers' user.
	pgDir, err := os.MkdirTemp("", "chaos-pg-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(pgDir)
	if err := prepareDir(pgDir, as); err != nil {
		return nil, err
	}
	primary, err := newPGServer("primary", bin, as, pgDir)
	if err != nil {
		return nil, err
	}
	standby, err := newPGServer("standby", bin, as, pgDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		primary.crash()
		standby.crash()
		for _, s := range []*pgServer{primary, standby} {
			if b, err := os.ReadFile(s.log); err == nil {
				os.WriteFile(filepath.Join(e.Dir, "postgres-"+s.name+".log"), b, 0o644)
			}
		}
	}()
	e.logf("failover: initdb the primary in %s", pgDir)
	if err := primary.initPrimary(ctx); err != nil {
		return nil, err
	}
	if err := primary.start(ctx); err != nil {
		return nil, err
	}
	repl, err := newProxy(primary.addr(), e.Seed)
	if err != nil {
		return nil, err
	}
	defer func() {
		// Sever before closing: close heals, which would deliver what the
		// blackhole held.
		repl.reset()
		repl.close()
	}()
	e.logf("failover: pg_basebackup the standby through the replication proxy %s", repl.addr)
	if err := standby.baseBackup(ctx, repl.addr); err != nil {
		return nil, err
	}
	if err := standby.start(ctx); err != nil {
		return nil, err
	}

	var rb [4]byte
	crand.Read(rb[:])
	prefix := "chaos" + hex.EncodeToString(rb[:]) + "_"
	tg, err := newTarget(cluster.Postgres, primary.dsn("chaos_harness"), e.Dir, prefix)
	if err != nil {
		return nil, err
	}
	origin := monotonicNow()
	h := &harness{e: &experiment{Dialect: cluster.Postgres, Seed: e.Seed, Nodes: e.Nodes, Timings: e.Timings, Pause: e.Pause, Dir: e.Dir, Log: e.Log},
		origin: origin, clk: newClock(origin), tg: tg, exe: exe}
	if h.db, err = tg.open(tg.dsn); err != nil {
		return nil, err
	}
	defer func() { h.db.Close() }() // h.db changes at the promotion
	sdb, err := sql.Open("pgx", standby.dsn("chaos_harness"))
	if err != nil {
		return nil, err
	}
	defer sdb.Close()
	res = &failoverResult{Seed: e.Seed, Timings: e.Timings, Outcomes: map[string]int{}, Faults: map[string]int{}}
	if err := h.db.QueryRowContext(ctx, "SHOW server_version").Scan(&res.Server); err != nil {
		return nil, err
	}
	if err := h.prepare(ctx); err != nil {
		return nil, err
	}
	defer h.teardown()

	// The nodes lead and write on the primary, which the standby follows.
	for i := range e.Nodes {
		p := &proc{id: fmt.Sprintf("n%d", i+1), idx: i}
		if p.dsn, err = tg.nodeDSN(p.id, primary.addr()); err != nil {
			return nil, err
		}
		h.procs = append(h.procs, p)
		if err := h.start(p); err != nil {
			return nil, err
		}
	}
	if h.waitToken(ctx, 0, 20*time.Second) == 0 {
		return nil, errors.New("no node led on the primary within 20s")
	}
	sleepCtx(ctx, e.Timings.TTL/2+time.Duration(rng.Int64N(int64(e.Timings.TTL))))
	if err := waitReplayed(ctx, h.db, sdb, 30*time.Second); err != nil {
		return nil, err
	}
	if err := sdb.QueryRowContext(ctx, "SELECT count(*) FROM "+tg.writesTable()).Scan(&res.CaughtUp); err != nil {
		return nil, err
	}

	// The lag: nothing more reaches the standby. A burst of commits, and
	// handovers, each a new grant.
	lag := fault{Kind: faultLag, Node: "standby", Detail: "replication connection blackholed both ways", Start: h.clk.now()}
	repl.blackhole(true, true)
	e.logf("  %6.1fs %s (standby caught up at %d rows)", float64(lag.Start)/1e9, lag.Detail, res.CaughtUp)
	burst := func() { sleepCtx(ctx, e.Timings.TTL/4+time.Duration(rng.Int64N(int64(e.Timings.TTL/2)))) }
	burst()
	for range e.Handovers {
		l, tok := h.leaderToken(ctx)
		if l == nil {
			if tok = h.waitToken(ctx, 0, 10*time.Second); tok == 0 {
				return nil, errors.New("no leader on the primary during the lag")
			}
			l, tok = h.leaderToken(ctx)
			if l == nil {
				continue
			}
		}
		f := fault{Kind: faultLeaderStop, Node: l.id, Detail: fmt.Sprintf("leader %s (token %d) shut down", l.id, tok), Start: h.clk.now()}
		e.logf("  %6.1fs %s", float64(f.Start)/1e9, f.Detail)
		l.terminate(10 * time.Second)
		next := h.waitToken(ctx, tok, 10*time.Second)
		if err := h.start(l); err != nil {
			return nil, err
		}
		f.End = h.clk.now()
		f.Detail += fmt.Sprintf("; token %d granted next", next)
		h.faults = append(h.faults, f)
		burst()
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	// The crash, right in the last burst, and the promotion.
	var primaryLSN string
	if err := h.db.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&primaryLSN); err != nil {
		return nil, err
	}
	crash := fault{Kind: faultPrimaryCrash, Node: "primary", Start: h.clk.now()}
	primary.crash()
	for _, p := range h.procs {
		p.kill()
	}
	lag.End = h.clk.now()
	repl.reset()
	if err := sdb.QueryRowContext(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn())::bigint", primaryLSN).Scan(&res.WALBehind); err != nil {
		return nil, err
	}
	e.logf("  %6.1fs primary crashed; the standby is at least %d bytes of WAL behind; promoting it", float64(crash.Start)/1e9, res.WALBehind)
	if err := standby.promote(ctx); err != nil {
		return nil, err
	}
	crash.End = h.clk.now()
	crash.Detail = fmt.Sprintf("primary crashed, standby promoted (%d bytes of WAL behind)", res.WALBehind)
	h.faults = append(h.faults, lag, crash)
	h.db.Close()
	h.tg.dsn = standby.dsn("chaos_harness")
	if h.db, err = h.tg.open(h.tg.dsn); err != nil {
		return nil, err
	}
	if h.lp, err = cluster.NewDBProvider(h.db, cluster.Postgres, prefix); err != nil {
		return nil, err
	}
	promoted, err := h.final(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the promoted database: %w", err)
	}
	res.PromotedToken, res.PromotedRows = uint64(promoted.LeaseToken), len(promoted.Writes)
	if promoted.Tip != nil {
		res.PromotedCounter = promoted.Tip.Counter
	}
	for _, p := range h.procs {
		v := nodeView{Node: p.id}
		if v.Token, v.Counter, err = readWitnessFile(filepath.Join(e.Dir, p.id+".witness")); err != nil {
			return nil, err
		}
		v.Saw = v.Token > res.PromotedToken || v.Counter > res.PromotedCounter
		res.Views = append(res.Views, v)
	}
	old := map[string]int{} // incarnations from before the failover
	for _, p := range h.procs {
		old[p.id] = p.inc
	}

	// After the failover: the new node first, alone, so that it leads;
	// then the nodes with their witness files; then the new node shuts
	// down, and whoever may lead, leads.
	fresh := &proc{id: fmt.Sprintf("n%d", e.Nodes+1), idx: e.Nodes}
	fresh.dsn, _ = h.tg.nodeDSN(fresh.id, standby.addr())
	h.procs = append(h.procs, fresh)
	if err := h.start(fresh); err != nil {
		return nil, err
	}
	h.waitToken(ctx, 0, 15*time.Second)
	sleepCtx(ctx, e.Timings.TTL)
	for _, p := range h.procs[:e.Nodes] {
		p.dsn, _ = h.tg.nodeDSN(p.id, standby.addr())
		if err := h.start(p); err != nil {
			return nil, err
		}
	}
	sleepCtx(ctx, 2*e.Timings.TTL)
	_, tok := h.leaderToken(ctx)
	stop := fault{Kind: faultLeaderStop, Node: fresh.id, Detail: fmt.Sprintf("new node %s (token %d) shut down", fresh.id, tok), Start: h.clk.now()}
	e.logf("  %6.1fs %s", float64(stop.Start)/1e9, stop.Detail)
	fresh.terminate(10 * time.Second)
	stop.End = h.clk.now()
	h.faults = append(h.faults, stop)
	sleepCtx(ctx, 2*e.Timings.TTL+2*e.Timings.Heartbeat)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	h.stopAll()
	fin, err := h.final(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the final state: %w", err)
	}

	before, afterH := map[string][]record{}, map[string][]record{}
	for _, p := range h.procs {
		for i, f := range p.files {
			rs, err := readHistory(f)
			if err != nil {
				return nil, err
			}
			name := fmt.Sprintf("%s.%d", p.id, i+1)
			if i < old[p.id] {
				before[name] = rs
			} else {
				afterH[name] = rs
			}
		}
	}
	h.mu.Lock()
	crashes := slices.Clone(h.crashes)
	h.mu.Unlock()
	res.FaultList = h.faults
	for _, f := range h.faults {
		res.Faults[f.Kind]++
	}
	checkFailover(res, before, afterH, promoted, fin, fresh.id, stop.Start)
	for _, c := range crashes {
		res.add(aCrash, "%s", c)
	}
	return res, nil
}

func (e *failoverExperiment) logf(format string, args ...any) {
	if e.Log != nil {
		fmt.Fprintf(e.Log, format+"\n", args...)
	}
}

// leaderToken returns the node the lease row names and its token, if its
// term is unexpired.
func (h *harness) leaderToken(ctx context.Context) (*proc, uint64) {
	lctx, cancel := context.WithTimeout(ctx, h.e.Timings.Heartbeat)
	defer cancel()
	l, err := h.lp.Leader(lctx, "leader")
	if err != nil || l == nil {
		return nil, 0
	}
	for _, p := range h.procs {
		if p.id == l.NodeID {
			return p, l.FencingToken
		}
	}
	return nil, l.FencingToken
}

// waitToken waits up to d for an unexpired term whose token is above
// after, and returns its token (0 if none came).
func (h *harness) waitToken(ctx context.Context, after uint64, d time.Duration) uint64 {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, tok := h.leaderToken(ctx); tok > after {
			return tok
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	return 0
}

// waitReplayed waits until the standby has replayed the primary's WAL up
// to where it was when called.
func waitReplayed(ctx context.Context, primary, standby *sql.DB, d time.Duration) error {
	var lsn string
	if err := primary.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return err
	}
	deadline := time.Now().Add(d)
	for {
		var done bool
		err := standby.QueryRowContext(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", lsn).Scan(&done)
		if err == nil && done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby did not replay the primary's WAL up to %s within %v (%v)", lsn, d, err)
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// readWitnessFile reads what a node's witness file records for the lease
// and the chain of the experiment. The format is the library's
// (witness.go); a missing file records nothing.
func readWitnessFile(path string) (token uint64, counter int64, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	var w struct {
		Leases map[string]uint64 `json:"leases"`
		Chains map[string]struct {
			Counter int64 `json:"counter"`
		} `json:"chains"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return 0, 0, fmt.Errorf("witness file %s: %w", path, err)
	}
	return w.Leases["leader"], w.Chains[chainName].Counter, nil
}

// checkFailover checks the histories from before and after the failover
// against the promoted database as it was at the promotion and at the
// end. freshID is the new node; stop is when it shut down.
func checkFailover(res *failoverResult, before, after map[string][]record, promoted, fin *finalState, freshID string, stop int64) {
	scratch := &result{Outcomes: map[string]int{}}
	opsOld, grantsOld, _, _ := collect(before, scratch)
	opsNew, grantsNew, beliefsNew, _ := collect(after, scratch)
	res.Writes = len(opsOld) + len(opsNew)

	// What was lost.
	for _, g := range grantsOld {
		if g.token > res.BeforeTop {
			res.BeforeTop, res.BeforeBy = g.token, g.proc
		}
		if g.token > res.PromotedToken {
			res.LostGrants = append(res.LostGrants, g)
		}
	}
	slices.SortFunc(res.LostGrants, func(a, b grant) int { return int(a.token) - int(b.token) })
	onPromoted := map[string]bool{}
	for _, w := range promoted.Writes {
		onPromoted[w.Op] = true
	}
	for _, o := range opsOld {
		if o.outcome == kOK {
			res.AckedOld++
			if !onPromoted[o.id] {
				res.LostWrites++
			}
		}
	}
	if len(res.LostGrants) == 0 {
		res.add(aNoLoss, "the promoted database's token %d is the highest granted on the primary (%d): no acquisition was lost, so the witness was not tested", res.PromotedToken, res.BeforeTop)
	}

	// Each node's witness against its own grants.
	for i := range res.Views {
		v := &res.Views[i]
		for _, g := range grantsOld {
			if node, _, _ := strings.Cut(g.proc, "."); node == v.Node {
				v.Granted = max(v.Granted, g.token)
			}
		}
		if v.Token < v.Granted {
			res.add(aWitnessMissed, "%s was granted token %d on the primary, but its witness file records %d", v.Node, v.Granted, v.Token)
		}
	}

	// After the failover.
	views := map[string]*nodeView{freshID: &res.Fresh}
	res.Fresh.Node = freshID
	for i := range res.Views {
		views[res.Views[i].Node] = &res.Views[i]
	}
	for p, rs := range after {
		node, _, _ := strings.Cut(p, ".")
		v := views[node]
		for _, r := range rs {
			if r.Kind != kEvent || !strings.HasPrefix(r.What, "new-failed") {
				continue
			}
			switch {
			case !strings.Contains(r.What, string(cluster.EventRollbackDetected)):
				if v.Other == "" {
					v.Other = r.Err
				}
			case strings.Contains(r.Err, "witness file"):
				if v.Refusals == 0 {
					v.Refusal = r.Err
				}
				v.Refusals++
			default:
				// The promoted database is one consistent point of the
				// primary's WAL plus fenced writes (checkChain verifies
				// its chain and tip at the end): nothing in it was
				// truncated or restored on its own.
				if v.False == 0 {
					v.FalseMsg = r.Err
				}
				v.False++
			}
		}
	}
	for _, v := range append([]*nodeView{&res.Fresh}, viewList(res.Views)...) {
		if v.False > 0 {
			res.add(aFalseRollback, "New on %s failed %d times with ErrRollbackDetected for an inconsistency the promoted database does not have: %q", v.Node, v.False, v.FalseMsg)
		}
	}
	slices.SortFunc(grantsNew, func(a, b grant) int { return int(a.token) - int(b.token) })
	for _, g := range grantsNew {
		node, _, _ := strings.Cut(g.proc, ".")
		views[node].Grants = append(views[node].Grants, g.token)
		if res.FirstAfter == 0 {
			res.FirstAfter, res.FirstAfterBy = g.token, node
		}
		if g.token <= res.BeforeTop {
			res.Reused = append(res.Reused, g.token)
		}
		if node != freshID && g.from >= stop && res.HandoverTo == "" {
			res.HandoverTo = fmt.Sprintf("%s (token %d)", node, g.token)
		}
	}
	final := map[string]dbWrite{}
	for _, w := range fin.Writes {
		final[w.Op] = w
	}
	for _, o := range sortedOps(opsNew) {
		node, _, _ := strings.Cut(o.proc, ".")
		w, in := final[o.id]
		switch o.outcome {
		case kOK:
			res.Outcomes["ok"]++
			views[node].Writes++
			if o.token <= res.BeforeTop {
				res.ReusedWrites++
			}
			if !in || w.Seq != o.seq || uint64(w.Token) != o.token {
				res.add(aFailoverWrites, "%s (token %d, #%d) was acknowledged on the promoted database but is not there as such", o.id, o.token, o.seq)
			}
		case kFail:
			res.Outcomes[o.what]++
			if in {
				res.add(aFailoverWrites, "%s failed before COMMIT (%s) but is in the promoted database as #%d", o.id, o.err, w.Seq)
			}
		default:
			res.Outcomes["info"]++
		}
	}
	for _, b := range beliefsNew {
		node, _, _ := strings.Cut(b.proc, ".")
		if v := views[node]; v.Saw && !slices.Contains(v.Grants, b.token) {
			v.Grants = append(v.Grants, b.token) // a belief without its grant still counts as leading
		}
	}
	for _, v := range res.Views {
		switch {
		case !v.Saw:
		case len(v.Grants) > 0 || v.Writes > 0:
			res.add(aLedRolledBack, "%s's witness file records token %d and chain counter %d, above the promoted database's %d and %d, yet it led there under %v and %d of its writes committed",
				v.Node, v.Token, v.Counter, res.PromotedToken, res.PromotedCounter, v.Grants, v.Writes)
		case v.Refusals == 0:
			res.add(aUndetected, "%s's witness file records token %d and chain counter %d, above the promoted database's %d and %d, but no New failed with ErrRollbackDetected (other failure: %q)",
				v.Node, v.Token, v.Counter, res.PromotedToken, res.PromotedCounter, v.Other)
		}
	}
	if len(res.Fresh.Grants) == 0 {
		res.add(aNoLeaderAfter, "the new node %s never led on the promoted database (New: %q)", freshID, res.Fresh.Other)
	}

	// The promoted database's own history still holds together, and the
	// processes after the failover never believed they led at once.
	checkCommitOrder(fin, scratch)
	checkChain(fin, mergeOps(opsOld, opsNew), scratch)
	checkGrants(fin, grantsNew, scratch)
	checkBeliefs(beliefsNew, nil, scratch)
	res.Anomalies = append(res.Anomalies, scratch.Anomalies...)
}

func viewList(vs []nodeView) []*nodeView {
	out := make([]*nodeView, len(vs))
	for i := range vs {
		out[i] = &vs[i]
	}
	return out
}

func mergeOps(a, b map[string]*writeOp) map[string]*writeOp {
	out := make(map[string]*writeOp, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// reportFailover prints the failover experiment's results.
func reportFailover(w io.Writer, r *failoverResult) {
	fmt.Fprintf(w, "servers     PostgreSQL %s primary and asynchronous standby, made by the harness, replication through its proxy\n", r.Server)
	fmt.Fprintf(w, "operations  %d writes; on the promoted database: %s\n", r.Writes, counts(r.Outcomes, "ok", "refused", "error", "info"))
	fmt.Fprintf(w, "faults      %d: %s\n", len(r.FaultList), counts(r.Faults, faultLag, faultLeaderStop, faultPrimaryCrash))
	fmt.Fprintf(w, "lost        the standby stopped at %d rows; at the crash it was at least %d bytes of WAL behind. The primary had granted tokens up to %d (%s) and acknowledged %d writes; the promoted database holds token %d, chain counter %d, %d rows: %d acknowledged writes and %d grants lost (%s)\n",
		r.CaughtUp, r.WALBehind, r.BeforeTop, r.BeforeBy, r.AckedOld, r.PromotedToken, r.PromotedCounter, r.PromotedRows, r.LostWrites, len(r.LostGrants), grantList(r.LostGrants))
	for _, v := range r.Views {
		fmt.Fprintf(w, "witness     %s\n", viewLine(v))
	}
	fmt.Fprintf(w, "new node    %s\n", viewLine(r.Fresh))
	reused := "none"
	if len(r.Reused) > 0 {
		reused = fmt.Sprintf("%v, %d writes acknowledged under them", r.Reused, r.ReusedWrites)
	}
	fmt.Fprintf(w, "tokens      highest granted before the failover %d, first granted after %d (to %s); granted twice: %s\n", r.BeforeTop, r.FirstAfter, r.FirstAfterBy, reused)
	handover := "no node led: every node left refuses"
	if r.HandoverTo != "" {
		handover = r.HandoverTo + " led"
	}
	fmt.Fprintf(w, "handover    after the new node shut down: %s\n", handover)
	writeAnomalies(w, r.Anomalies)
}

func grantList(gs []grant) string {
	if len(gs) == 0 {
		return "none"
	}
	var parts []string
	for _, g := range gs {
		node, _, _ := strings.Cut(g.proc, ".")
		parts = append(parts, fmt.Sprintf("%d to %s", g.token, node))
	}
	return strings.Join(parts, ", ")
}

func viewLine(v nodeView) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: ", v.Node)
	if v.Token != 0 || v.Counter != 0 {
		fmt.Fprintf(&b, "witness file at token %d, chain counter %d", v.Token, v.Counter)
		if v.Granted != 0 {
			fmt.Fprintf(&b, " (granted up to %d on the primary)", v.Granted)
		}
		if v.Saw {
			b.WriteString(", above the promoted database")
		} else {
			b.WriteString(", not above the promoted database")
		}
		b.WriteString("; ")
	} else {
		b.WriteString("witness file empty at start; ")
	}
	if v.Refusals > 0 {
		fmt.Fprintf(&b, "New refused %d times with ErrRollbackDetected (%q); ", v.Refusals, v.Refusal)
	}
	if v.False > 0 {
		fmt.Fprintf(&b, "New failed %d times with a false ErrRollbackDetected; ", v.False)
	}
	if len(v.Grants) > 0 {
		fmt.Fprintf(&b, "led under tokens %v, %d writes acknowledged", v.Grants, v.Writes)
	} else {
		b.WriteString("never led")
	}
	return b.String()
}
