package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver
	"github.com/jackc/pgx/v5"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
	"github.com/sqlfence/cluster/provider"
)

// envNode, when set, makes this program a node: its value is the node's
// configuration as JSON. The harness re-executes itself with it.
const envNode = "CHAOS_NODE"

// nodeConfig is what the harness tells a node process.
type nodeConfig struct {
	ID           string
	Incarnation  int
	Dialect      cluster.Dialect
	Driver       string
	DSN          string
	Prefix       string
	History      string // the history file this process appends to
	Witness      string // Config.WitnessFile, kept across restarts
	Origin       int64  // the harness's CLOCK_MONOTONIC reading at its start
	TTL          time.Duration
	Heartbeat    time.Duration
	FenceTimeout time.Duration
	Pause        time.Duration // between two writes of a term
	StaleWrites  int           // writes under the old token after each term ends
	WallOffset   time.Duration // how far this node's wall clock is set off
	Mutant       string
	Stack        string // how the node reaches its database: stackSQL or stackPgx
	Lanes        int    // lane keys of the lanes workload (0: none)
}

// Stacks: how a node reaches its database.
const (
	// stackSQL: database/sql as Config.DB; followers poll.
	stackSQL = ""
	// stackPgx (PostgreSQL): a pool of clusterpgx.OpenDB given to the
	// cluster through clusterpgx.NewStdlibProvider, so followers LISTEN
	// and each that hears a release attempts once; fenced writes begin
	// with Cluster.BeginFenced (the BEGIN and the fence in one round trip).
	stackPgx = "pgx"
)

// The mutants a node can play (see mutant_test.go and RELIABILITY.md).
const (
	mutantNone      = ""
	mutantSkipFence = "skip-fence" // writes without Fence, keeps writing under its old token
	mutantLongTrust = "long-trust" // believes it leads for 3×LeaseTTL after its last acquire or renew
	mutantSteal     = "steal"      // takes the lease row with raw SQL, ignoring its expiry
	mutantTipGuard  = "tip-guard"  // (harness) the chain-tip guard triggers are dropped
)

// Write styles.
const (
	styleFenced   = "fenced"    // Fence, then the rows, then AdvanceTip: what the library asks of users
	stylePlain    = "plain"     // Fence, then the row: no chain, so only the fence orders it
	styleStaleTip = "stale-tip" // no Fence; the rows and a raw tip write under the old token
	styleUnfenced = "unfenced"  // no Fence, no tip: only the row (the skip-fence mutant)
	styleLane     = "lane"      // ClaimLane, then the lane's row under the lane's token
)

const chainName = "audit"

// A node is one member of the cluster under test, in its own process.
type node struct {
	cfg nodeConfig
	clk *clock
	h   *historyWriter
	log *slog.Logger
	db  *sql.DB
	c   *cluster.Cluster

	ops int // writes invoked; owned by the write path (one at a time per goroutine)
	mu  sync.Mutex
	// acquireStarts are the starts of successful acquire calls not yet
	// paired with a lease-acquired event.
	acquireStarts []int64
	lastOK        int64  // start of the last successful acquire or renew (long-trust)
	lastToken     uint64 // token of the last lease-acquired event
	stolen        uint64 // token of the term taken by the steal mutant
	stolenUntil   int64  // its trust window's end
	opMu          sync.Mutex
	zombies       sync.WaitGroup
	root          context.Context // ends at SIGTERM
}

func nodeMain(raw string) int {
	var cfg nodeConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "chaos node: bad config:", err)
		return 2
	}
	n := &node{cfg: cfg, clk: newClock(cfg.Origin)}
	h, err := createHistory(cfg.History)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos node:", err)
		return 2
	}
	n.h = h
	defer h.close()
	// The node's logs show its wall clock set off by WallOffset. Nothing
	// the node or the library decides reads the wall clock: expiry is the
	// database's, and belief ends on the monotonic clock.
	n.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{
		Level: slog.LevelInfo,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				a.Value = slog.TimeValue(a.Value.Time().Add(cfg.WallOffset))
			}
			return a
		},
	})).With("node", cfg.ID, "incarnation", cfg.Incarnation)
	n.h.add(record{T: n.clk.now(), Kind: kStart,
		What: fmt.Sprintf("pid=%d wall=%s offset=%s mutant=%q", os.Getpid(), time.Now().Add(cfg.WallOffset).Format(time.RFC3339Nano), cfg.WallOffset, cfg.Mutant)})

	// SIGUSR1 asks the node to resign (the harness's resign fault). The Go
	// runtime ignores it until then; a signal that comes before the
	// cluster runs (New retrying) is dropped (see resigner).
	resign := make(chan os.Signal, 1)
	signal.Notify(resign, syscall.SIGUSR1)
	defer signal.Stop(resign)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	n.root = ctx
	db, provider, err := open(cfg)
	if err != nil {
		n.log.Error("open", "err", err)
		return 2
	}
	defer db.Close()
	n.db = db
	// The node records its transitions from a goroutine of its own, which
	// drains the channel once Shutdown has sent the last.
	events, eventsStop, eventsDone := make(chan cluster.Event, 1024), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(eventsDone)
		for {
			select {
			case e := <-events:
				n.transition(e)
			case <-eventsStop:
				for len(events) > 0 {
					n.transition(<-events)
				}
				return
			}
		}
	}()
	defer func() { close(eventsStop); <-eventsDone }()

	ccfg := cluster.Config{
		NodeID:            cfg.ID,
		DB:                db,
		TablePrefix:       cfg.Prefix,
		LeaseTTL:          cfg.TTL,
		HeartbeatInterval: cfg.Heartbeat,
		FenceTimeout:      cfg.FenceTimeout,
		SkipMigrations:    true, // the harness made the schema (and may have removed guards)
		Chains:            []cluster.Chain{{Name: chainName, Table: cfg.Prefix + "audit"}},
		WitnessFile:       cfg.Witness,
		Logger:            n.log,
		Observer:          n.observe,
		Events:            events,
	}
	if provider != nil {
		ccfg.DB, ccfg.TablePrefix, ccfg.Provider = nil, "", provider
	}
	for {
		n.c, err = cluster.New(ctx, ccfg)
		if err == nil {
			break
		}
		n.log.Warn("New failed; retrying", "err", err)
		what := "new-failed"
		if errors.Is(err, cluster.ErrRollbackDetected) {
			what += " " + string(cluster.EventRollbackDetected)
		}
		n.h.add(record{T: n.clk.now(), Kind: kEvent, What: what, Err: err.Error()})
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(cfg.Heartbeat):
		}
	}

	var wg sync.WaitGroup
	wg.Go(func() { n.sample(ctx) })
	wg.Go(func() { n.c.RunWhileLeader(ctx, n.term) })
	if cfg.Mutant == mutantSteal {
		wg.Go(func() { n.steal(ctx) })
	}
	wg.Go(func() { n.resigner(ctx, resign) })
	wg.Go(func() { n.bumps(ctx) })
	if cfg.Lanes > 0 {
		wg.Go(func() { n.lanes(ctx) })
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.c.Shutdown(sctx); err != nil {
		n.log.Warn("Shutdown", "err", err)
	}
	wg.Wait()
	n.zombies.Wait()
	return 0
}

// open opens the node's pool and, for stackPgx, the provider over it (nil
// otherwise: the cluster's default provider over Config.DB).
func open(cfg nodeConfig) (*sql.DB, provider.Provider, error) {
	switch cfg.Stack {
	case stackSQL:
		db, err := sql.Open(cfg.Driver, cfg.DSN)
		return db, nil, err
	case stackPgx:
		if cfg.Dialect != cluster.Postgres {
			return nil, nil, fmt.Errorf("stack %q needs PostgreSQL, not %s", cfg.Stack, cfg.Dialect)
		}
		pc, err := pgx.ParseConfig(cfg.DSN)
		if err != nil {
			return nil, nil, err
		}
		db := clusterpgx.OpenDB(*pc)
		p, err := clusterpgx.NewStdlibProvider(db, cfg.Prefix)
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return db, p, nil
	}
	return nil, nil, fmt.Errorf("unknown stack %q", cfg.Stack)
}

// resigner resigns the node's term each time the harness sends SIGUSR1,
// and records the call and its outcome. A signal that came before it ran
// (while New was retrying, when the node could not lead) is dropped, so
// no resign happens outside the fault that asked for it.
func (n *node) resigner(ctx context.Context, sig <-chan os.Signal) {
	select {
	case <-sig:
		n.h.add(record{T: n.clk.now(), Kind: kEvent, What: "resign dropped: it came before the cluster ran"})
	default:
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
		}
		tok := n.c.FencingToken()
		rctx, cancel := context.WithTimeout(ctx, n.cfg.TTL)
		err := n.c.Resign(rctx)
		cancel()
		r := record{T: n.clk.now(), Kind: kEvent, Token: tok, What: "resign"}
		if err != nil {
			r.Err = err.Error()
		}
		n.h.add(r)
	}
}

// observe is the Observer: it runs on the heartbeat goroutine and only
// notes times.
func (n *node) observe(op cluster.Operation) {
	if guardRefused(op.Err) {
		n.h.add(record{T: n.clk.now(), Kind: kEvent, What: eventGuardRefused + " " + string(op.Kind), Err: op.Err.Error()})
	}
	if op.Outcome != cluster.OutcomeOK || (op.Kind != cluster.OpAcquire && op.Kind != cluster.OpRenew) {
		return
	}
	start := n.clk.now() - int64(op.Duration)
	n.mu.Lock()
	if op.Kind == cluster.OpAcquire {
		n.acquireStarts = append(n.acquireStarts, start)
	}
	n.lastOK = max(n.lastOK, start)
	n.mu.Unlock()
}

// guardRefused says whether err is a guard trigger's refusal that no
// statement of a correct library meets (see eventGuardRefused).
func guardRefused(err error) bool {
	for _, g := range []error{cluster.ErrTokenLowered, cluster.ErrLeaseDeleted, cluster.ErrLaneDeleted,
		cluster.ErrTipRewritten, cluster.ErrTipDeleted} {
		if errors.Is(err, g) {
			return true
		}
	}
	return false
}

// transition records the library's events. A lease-acquired event is a
// grant, between the start of the earliest successful acquire call not yet
// paired and now: the interval contains the statement that granted it.
func (n *node) transition(e cluster.Event) {
	now := n.clk.now()
	what := string(e.Kind)
	if e.Reason != "" {
		what += " " + string(e.Reason)
	}
	if e.LeaderID != "" {
		what += " leader=" + e.LeaderID
	}
	n.h.add(record{T: now, Kind: kEvent, Token: e.FencingToken, What: what})
	if e.Kind != cluster.EventLeaseAcquired {
		return
	}
	n.mu.Lock()
	from := int64(0) // no acquire seen: since the experiment began
	if len(n.acquireStarts) > 0 {
		from = n.acquireStarts[0]
	}
	n.acquireStarts = n.acquireStarts[:0]
	n.lastToken = e.FencingToken
	n.mu.Unlock()
	n.h.add(record{T: now, Kind: kGrant, Token: e.FencingToken, From: from, To: now, What: "acquire"})
}

// believes is what this node takes to be its leadership: the library's
// (IsLeader, with its token), unless a mutant replaces it.
func (n *node) believes() uint64 {
	tok := n.c.FencingToken() // IsLeader and the token, read at once
	switch n.cfg.Mutant {
	case mutantLongTrust:
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.lastToken != 0 && n.clk.now() < n.lastOK+int64(3*n.cfg.TTL) {
			return n.lastToken
		}
		return 0
	case mutantSteal:
		if tok != 0 {
			return tok
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.stolen != 0 && n.clk.now() < n.stolenUntil {
			return n.stolen
		}
	}
	return tok
}

// sample polls the node's belief every few milliseconds and records each
// interval throughout which it held: from just after the first sample that
// saw it to just before the last one, so the interval is certain. A change
// of token ends an interval. An open interval is recorded every 50ms, so a
// SIGKILL loses at most that much of it.
func (n *node) sample(ctx context.Context) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var tok uint64
	var from, last, flushed int64
	heard := false
	end := func() {
		if tok != 0 && last > from {
			n.h.add(record{T: n.clk.now(), Kind: kBelief, Token: tok, From: from, To: last})
		}
		tok = 0
	}
	for {
		if !heard && n.c.Stats().HearingReleases {
			heard = true
			n.h.add(record{T: n.clk.now(), Kind: kEvent, What: eventHearing})
		}
		t0 := n.clk.now()
		b := n.believes()
		t1 := n.clk.now()
		if b != tok {
			end()
			if b != 0 {
				tok, from, last, flushed = b, t1, t1, t1
			}
		} else if b != 0 {
			last = t0
			if last-flushed >= int64(50*time.Millisecond) && last > from {
				n.h.add(record{T: t1, Kind: kBelief, Token: tok, From: from, To: last, What: "open"})
				flushed = last
			}
		}
		select {
		case <-ctx.Done():
			end()
			return
		case <-tick.C:
		}
	}
}

// term is the leader work: fenced writes while the term lasts, then (when
// configured) a few writes under the term's token after it ended, which
// the database must refuse.
func (n *node) term(ctx context.Context, token uint64) error {
	// Fenced writes alternate with and without the audit chain: the
	// tip's guard re-checks the token and locks the lease row, which
	// would hide a broken fence if every write advanced a tip.
	styles := []string{styleFenced, stylePlain}
	if n.cfg.Mutant == mutantSkipFence {
		styles = []string{styleUnfenced}
	}
	for i := 0; ctx.Err() == nil; i++ {
		n.write(ctx, styles[i%len(styles)], token)
		select {
		case <-ctx.Done():
		case <-time.After(n.cfg.Pause):
		}
	}
	if n.cfg.StaleWrites > 0 {
		stale := styleStaleTip
		if n.cfg.Mutant == mutantSkipFence {
			stale = styleUnfenced
		}
		n.zombies.Go(func() { n.zombie(stale, token) })
	}
	return ctx.Err()
}

// zombie writes under an ended term's token, as a process paused past its
// term would: StaleWrites writes, half a LeaseTTL apart.
func (n *node) zombie(style string, token uint64) {
	for i := 0; i < n.cfg.StaleWrites; i++ {
		if i > 0 {
			select {
			case <-n.root.Done():
				return
			case <-time.After(n.cfg.TTL / 2):
			}
		}
		if n.root.Err() != nil {
			return
		}
		n.write(n.root, style, token)
	}
}

// write runs one write transaction and records its invocation and outcome.
func (n *node) write(ctx context.Context, style string, token uint64) {
	n.opMu.Lock()
	n.ops++
	id := fmt.Sprintf("%s.%d#%d", n.cfg.ID, n.cfg.Incarnation, n.ops)
	n.opMu.Unlock()
	inv := record{T: n.clk.now(), Kind: kInvoke, Op: id, What: style}
	if !fenced(style) {
		inv.Token = token
	}
	n.h.add(inv)
	tctx, cancel := context.WithTimeout(ctx, n.cfg.TTL)
	defer cancel()
	r := n.txn(tctx, style, token, id)
	r.T, r.Op = n.clk.now(), id
	n.h.add(r)
}

// txn is one write: the locked counter row gives it its commit-order
// number and the audit chain's next counter and previous hash; it inserts
// the write-log row and, unless the style is plain or unfenced, the audit
// row, and advances the chain's tip.
func (n *node) txn(ctx context.Context, style string, token uint64, id string) record {
	d, p := n.cfg.Dialect, n.cfg.Prefix
	fail := func(stage string, err error) record {
		what := "error"
		if errors.Is(err, cluster.ErrStaleFencingToken) || strings.Contains(err.Error(), "SF001") || strings.Contains(err.Error(), "stale fencing token") {
			what = "refused"
		}
		return record{Kind: kFail, Token: token, Err: stage + ": " + err.Error(), What: what}
	}
	var tx *sql.Tx
	var err error
	if fenced(style) && n.cfg.Stack == stackPgx {
		// On a pool of clusterpgx.OpenDB the BEGIN and the fence in one
		// round trip.
		if tx, token, err = n.c.BeginFenced(ctx, n.db, nil); err != nil {
			return fail("begin and fence", err)
		}
	} else {
		if tx, err = n.db.BeginTx(ctx, nil); err != nil {
			return fail("begin", err)
		}
		if fenced(style) {
			if token, err = n.c.Fence(ctx, tx); err != nil {
				tx.Rollback()
				return fail("fence", err)
			}
		}
	}
	defer tx.Rollback()
	if style == stylePlain {
		// The transaction's own work, between its fence and its writes
		// (reads, computation): a release or a grant that the fence does
		// not hold off commits in this window, before the write.
		select {
		case <-ctx.Done():
			return fail("work", ctx.Err())
		case <-time.After(2 * n.cfg.Pause):
		}
	}
	lock := " FOR UPDATE"
	if d == cluster.SQLite {
		lock = "" // the transaction holds the write lock from BEGIN
	}
	if style == styleStaleTip && d != cluster.SQLite {
		// Lock the lease row as the tip's guard will, before the counter:
		// a grant locks the lease row, then the counter (the term log's
		// trigger), and the other order could deadlock with it.
		if _, err := tx.ExecContext(ctx, bind(d, "SELECT fencing_token FROM "+p+"lease WHERE name = ?"+lockShare(d)), "leader"); err != nil {
			return fail("lock lease", err)
		}
	}
	var seq, counter int64
	var prev []byte
	if err := tx.QueryRowContext(ctx, "SELECT n, a, h FROM "+p+"seq WHERE id = 1"+lock).Scan(&seq, &counter, &prev); err != nil {
		return fail("lock counter", err)
	}
	seq++
	payload := fmt.Sprintf("%s|%d|%d", id, token, seq)
	hash := append([]byte{}, prev...) // never nil: the column is NOT NULL
	chained := style == styleFenced || style == styleStaleTip
	if chained {
		counter++
		sum := sha256.Sum256(append(append([]byte{}, prev...), payload...))
		hash = sum[:]
	}
	if _, err := tx.ExecContext(ctx, bind(d, "UPDATE "+p+"seq SET n = ?, a = ?, h = ? WHERE id = 1"), seq, counter, hash); err != nil {
		return fail("update counter", err)
	}
	if _, err := tx.ExecContext(ctx, bind(d, "INSERT INTO "+p+"writes (seq, token, op) VALUES (?, ?, ?)"), seq, int64(token), id); err != nil {
		return fail("insert write", err)
	}
	if chained {
		if _, err := tx.ExecContext(ctx, bind(d, "INSERT INTO "+p+"audit (monotonic_counter, row_hash, payload) VALUES (?, ?, ?)"), counter, hash, payload); err != nil {
			return fail("insert audit", err)
		}
	}
	switch style {
	case styleFenced:
		if err := n.c.AdvanceTip(ctx, tx, chainName, uint64(counter), hash); err != nil {
			return fail("advance tip", err)
		}
	case styleStaleTip:
		if _, err := tx.ExecContext(ctx, tipUpsert(d, p), chainName, "leader", counter, hash, int64(token)); err != nil {
			return fail("raw tip", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return record{Kind: kInfo, Token: token, Seq: seq, Err: "commit: " + err.Error()}
	}
	return record{Kind: kOK, Token: token, Seq: seq}
}

// steal is the steal mutant: every 3×LeaseTTL, when it does not lead, the
// node takes the lease row with raw SQL that ignores its expiry, as an
// acquire statement without its expiry check would, and believes it leads
// for FenceTimeout.
func (n *node) steal(ctx context.Context) {
	d, p := n.cfg.Dialect, n.cfg.Prefix
	now := nowMillis(d)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(3 * n.cfg.TTL):
		}
		if n.believes() != 0 {
			continue
		}
		start := n.clk.now()
		tctx, cancel := context.WithTimeout(ctx, n.cfg.Heartbeat)
		var tok int64
		err := func() error {
			tx, err := n.db.BeginTx(tctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(tctx, bind(d, "UPDATE "+p+"lease SET holder = ?, instance = ?, fencing_token = fencing_token + 1, acquired_at = "+now+
				", renewed_at = "+now+", expires_at = "+now+" + ? WHERE name = ?"), n.cfg.ID+"~steal", "steal", n.cfg.TTL.Milliseconds(), "leader"); err != nil {
				return err
			}
			if err := tx.QueryRowContext(tctx, bind(d, "SELECT fencing_token FROM "+p+"lease WHERE name = ?"), "leader").Scan(&tok); err != nil {
				return err
			}
			return tx.Commit()
		}()
		cancel()
		end := n.clk.now()
		if err != nil {
			n.log.Info("steal failed", "err", err)
			continue
		}
		n.mu.Lock()
		n.stolen, n.stolenUntil = uint64(tok), start+int64(n.cfg.FenceTimeout)
		n.mu.Unlock()
		n.h.add(record{T: end, Kind: kGrant, Token: uint64(tok), From: start, To: end, What: "steal"})
	}
}

// bumps is the config-version workload: every ten write pauses, leader or
// not, the node bumps the version and records what the call returned. A
// failed call is of unknown outcome: its one statement may have committed.
func (n *node) bumps(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * n.cfg.Pause):
		}
		from := n.clk.now()
		n.h.add(record{T: from, Kind: kBump, What: "call"}) // before: a killed process's bump may commit
		bctx, cancel := context.WithTimeout(ctx, n.cfg.TTL)
		v, err := n.c.BumpConfigVersion(bctx)
		cancel()
		r := record{T: n.clk.now(), Kind: kBump, From: from, What: "ok", Seq: int64(v)}
		r.To = r.T
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.What, r.Seq, r.Err = "unknown", 0, err.Error()
		}
		n.h.add(r)
	}
}

// fenced reports whether writes of style call Fence.
func fenced(style string) bool { return style == styleFenced || style == stylePlain }

// lockShare is the dialect's clause that locks a row for share.
func lockShare(d cluster.Dialect) string {
	if d == cluster.MySQL {
		return " LOCK IN SHARE MODE"
	}
	return " FOR SHARE"
}

// laneKey is the key of lane i of the lanes workload.
func laneKey(i int) string { return fmt.Sprintf("lane%d", i) }

// lanes is the lanes workload: leader or not, the node goes round the
// lane keys, starting from a key of its own, and in each pause tries one
// lane write: a transaction that claims the lane (ClaimLane, the lane's
// fence) and writes the lane's row under the lane's token. A lane another
// node holds, or one above this node's share, is skipped, as a worker
// would.
func (n *node) lanes(ctx context.Context) {
	var idx int
	fmt.Sscanf(n.cfg.ID, "n%d", &idx)
	for i := idx; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * n.cfg.Pause):
		}
		n.laneWrite(ctx, laneKey(i%n.cfg.Lanes))
	}
}

// laneWrite runs one lane transaction. It is recorded only once the claim
// succeeded (a refused claim writes nothing): its invocation with the
// lane's token, then its outcome.
func (n *node) laneWrite(ctx context.Context, key string) {
	d, p := n.cfg.Dialect, n.cfg.Prefix
	tctx, cancel := context.WithTimeout(ctx, n.cfg.TTL)
	defer cancel()
	tx, err := n.db.BeginTx(tctx, nil)
	if err != nil {
		return
	}
	defer tx.Rollback()
	tok, err := n.c.ClaimLane(tctx, tx, key)
	if err != nil {
		return // held, over the share, or failed: nothing was written
	}
	n.opMu.Lock()
	n.ops++
	id := fmt.Sprintf("%s.%d#%d", n.cfg.ID, n.cfg.Incarnation, n.ops)
	n.opMu.Unlock()
	n.h.add(record{T: n.clk.now(), Kind: kInvoke, Op: id, What: styleLane, Lane: key, Token: tok})
	r := func() record {
		fail := func(stage string, err error) record {
			return record{Kind: kFail, Token: tok, Err: stage + ": " + err.Error(), What: "error"}
		}
		lock := " FOR UPDATE"
		if d == cluster.SQLite {
			lock = ""
		}
		var seq int64
		if err := tx.QueryRowContext(tctx, "SELECT n FROM "+p+"seq WHERE id = 1"+lock).Scan(&seq); err != nil {
			return fail("lock counter", err)
		}
		seq++
		if _, err := tx.ExecContext(tctx, bind(d, "UPDATE "+p+"seq SET n = ? WHERE id = 1"), seq); err != nil {
			return fail("update counter", err)
		}
		if _, err := tx.ExecContext(tctx, bind(d, "INSERT INTO "+p+"lanewrites (seq, lane, token, op) VALUES (?, ?, ?, ?)"), seq, key, int64(tok), id); err != nil {
			return fail("insert lane write", err)
		}
		if err := tx.Commit(); err != nil {
			return record{Kind: kInfo, Token: tok, Seq: seq, Err: "commit: " + err.Error()}
		}
		return record{Kind: kOK, Token: tok, Seq: seq}
	}()
	r.T, r.Op, r.Lane = n.clk.now(), id, key
	n.h.add(r)
}
