package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/sqlfence/cluster/provider"
)

// A Cluster is one node's membership in a cluster: it campaigns for the
// lease, renews it while it leads, and reports transitions. Create it with
// [New]; its methods are safe for concurrent use.
type Cluster struct {
	cfg      Config
	log      *slog.Logger
	provider provider.Provider
	// The provider's optional capabilities, nil when it lacks them.
	fencer   provider.Fencer
	chains   provider.ChainStore
	state    provider.StateStore
	releaser provider.InstanceReleaser
	instance string
	events   *notifier

	observeMu sync.Mutex                        // serializes Observe
	observers atomic.Pointer[[]func(Operation)] // added by Observe; read by record without a lock

	// term is the lease this node believes it holds, nil when it holds none.
	// until is where its trust window ends, on the monotonic clock (see
	// mono): 0 when no term is held, and MaxInt64 for the single leader
	// of a process that never called Init. IsLeader reads until alone.
	// Both are written only under mu (until is moved on by renew's CAS
	// too), in the order that keeps IsLeader from being true without a
	// term. The default member shares until with the package-level
	// IsLeader (std.until).
	term    atomic.Pointer[term]
	until   *atomic.Int64
	mu      sync.Mutex
	stopped bool
	retired *term // the term the first Shutdown ended (retire)

	// unsure is set when an acquisition failed in a way that may have
	// committed anyway, so Shutdown releases whatever this instance holds.
	unsure bool

	// retiring is a term that ended by Shutdown or Resign but whose leader
	// work is still stopping: the heartbeat keeps renewing it, so no other
	// node can start the same work until the lease is released.
	retiring atomic.Pointer[term]
	// stepMu is held by the heartbeat goroutine through each step, so a
	// release of this node's own term can wait out a renew in flight
	// (quiesce).
	stepMu sync.Mutex
	// holdUntil is the monotonic time before which a node that resigned
	// does not campaign.
	holdUntil atomic.Int64

	// Owned by the heartbeat goroutine.
	warnedDup string // instance of a same-NodeID holder already logged
	// pollNext says the next attempt is a routine poll (LeaseRequest.Poll):
	// the last one found the lease held, and the next comes at the poll
	// interval, not at the lease's expiry nor on a wake-up.
	pollNext      bool
	renewFailures int   // consecutive failed renews of the current term
	halted        error // why campaigning stopped for good (a detected rollback)

	// seen is the last term (or free lease) this node observed, for
	// leader-changed events.
	seenMu       sync.Mutex
	seen         observed
	seenEndpoint string // of the term seen, "" when free or unknown

	members      provider.MemberStore // nil when the provider keeps no membership
	wake         chan struct{}        // a release was heard: try now
	own          *DBProvider          // the provider New built over Config.DB, closed by Shutdown; nil for Config.Provider
	stopWatch    func()               // ends the watch of releases (wake.go); nil when none runs
	hearing      atomic.Bool          // releases by other processes are heard (LISTEN)
	heartbeating atomic.Bool          // the heartbeat (or a follower's watch) runs
	joined       atomic.Bool          // this node's membership row was recorded and the node has not left
	joins        atomic.Uint64        // successful joins of the membership row (a row taken over is joined again)
	haltedFlag   atomic.Bool          // halted is set; readable from any goroutine
	steps        int                  // heartbeat steps, for the membership refresh; heartbeat goroutine only
	rowChecked   atomic.Int64         // mono() of the last join or check that the membership row is this node's
	mustJoin     atomic.Bool          // the membership row must be recorded (again): the heartbeat and the lanes' keeper join (members.go)
	joining      atomic.Bool          // a membership refresh or join runs (memberLater, joinNow: one at a time)

	// Leader work (RunWhileLeader).
	workers map[*worker]struct{} // under mu
	work    workCount
	downCh  chan struct{} // closed when Shutdown begins

	cancel context.CancelFunc
	wg     sync.WaitGroup

	// shutDone is made by the first Shutdown and closed when it returns,
	// after it set shutdownErr.
	shutMu      sync.Mutex
	shutDone    chan struct{}
	shutdownErr error
	down        atomic.Bool

	errNotLeader error // returned by RequireLeader while running
	errDown      error // returned by every call after Shutdown
	errDownFence error // errDown for Fence and AdvanceTip: also ErrStaleFencingToken
	lookups      singleflight.Group
	lookupCtx    context.Context // ended by Shutdown
	stopLookups  context.CancelFunc
	lookupWork   workCount    // shared reads running
	wit          witnessState // Config.WitnessFile in memory
	stats        stats
	// lookupFailing is set while discovery lookups fail, to log once.
	lookupFailing atomic.Bool

	lanes laneState   // lanes.go: this node's lanes and the keeper
	conf  configState // configversion.go: the config version seen
}

// term is one acquired lease; Cluster.until is the end of this node's
// belief in it.
type term struct {
	lease provider.Lease

	// ctx is cancelled when the term ends, by the timer at the trust-window
	// deadline at the latest; leader work runs under it.
	ctx    context.Context
	cancel context.CancelFunc
	timer  *time.Timer

	// releasing is set, under Cluster.stepMu, before this node releases
	// the term itself: the heartbeat renews it no more.
	releasing bool
}

// termMargin is how long before the trust-window deadline a term with no
// successful renew is ended by its timer, so that its context is cancelled
// by the time IsLeader would turn false on its own.
func (c *Cluster) termMargin() time.Duration {
	return min(c.cfg.FenceTimeout/100, 2*time.Millisecond)
}

// newTerm makes the term of lease l, whose trust window ends at until,
// and arms its timer; the caller holds mu and makes it current
// (Cluster.term, then Cluster.until) before releasing it.
func (c *Cluster) newTerm(l provider.Lease, until int64) *term {
	t := &term{lease: l}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.timer = time.AfterFunc(c.untilMargin(until), func() { c.expire(t) })
	return t
}

// untilMargin is how long from now a term's timer must wait for the
// trust window that ends at until.
func (c *Cluster) untilMargin(until int64) time.Duration {
	return max(time.Duration(until-mono())-c.termMargin(), 0)
}

// expire runs on t's timer. Unless a renew moved the deadline on, it ends
// the trust window now and cancels the term's context; the heartbeat then
// reports the term as self-fenced.
func (c *Cluster) expire(t *term) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.term.Load() != t {
		return // t ended meanwhile; its timer had already fired
	}
	// The new deadline is never u itself, even when the timer ran late: a
	// renew that read the clock before u and compares-and-swaps from u
	// must fail, or it would extend a window whose term is cancelled.
	u := c.until.Load()
	if now := mono(); now < u-int64(c.termMargin()) || !c.until.CompareAndSwap(u, min(u-1, now)) {
		t.timer.Reset(c.untilMargin(c.until.Load())) // renewed meanwhile
		return
	}
	t.cancel()
}

// end cancels the term's context; IsLeader is made false by the caller.
func (t *term) end() {
	t.cancel()
	t.timer.Stop()
}

// monoBase anchors mono; time.Since reads the monotonic clock.
var monoBase = time.Now()

// mono returns the monotonic clock in nanoseconds; it is always positive.
func mono() int64 { return int64(time.Since(monoBase)) + 1 }

// monoAfter returns the monotonic reading d after t. It saturates instead
// of wrapping, so a deadline can never land in the past because a sum
// overflowed. Every deadline on the monotonic clock is computed with it.
func monoAfter(t int64, d time.Duration) int64 {
	switch {
	case d > 0 && t > math.MaxInt64-int64(d):
		return math.MaxInt64
	case d < 0 && t < math.MinInt64-int64(d):
		return math.MinInt64
	}
	return t + int64(d)
}

// New validates cfg, prepares the lease store (creating the cluster tables
// when cfg.Provider is nil), makes this node's first attempt to acquire the
// lease, and starts the heartbeat that renews or campaigns for it. A lone
// node whose first attempt succeeds leads when New returns.
//
// Call [Cluster.Shutdown] to stop the heartbeat and release the lease.
func New(ctx context.Context, cfg Config) (*Cluster, error) {
	return newCluster(ctx, cfg, nil, nil)
}

// newCluster is New for Init as well: the Cluster keeps its trust-window
// deadline in until when that is not nil (Init passes the package-level
// IsLeader's), and when created is not nil, newCluster calls it with the
// Cluster before New emits any event or campaigns, for Init to register
// its handlers and answer for the Cluster while New runs.
func newCluster(ctx context.Context, cfg Config, until *atomic.Int64, created func(*Cluster)) (*Cluster, error) {
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if until == nil {
		until = new(atomic.Int64)
	}
	c := &Cluster{
		cfg:      cfg,
		log:      cfg.Logger.With("node_id", cfg.NodeID, "lease", cfg.LeaseName),
		provider: cfg.Provider,
		instance: newInstanceID(),
		until:    until,
	}
	if cfg.ResignHoldOff < cfg.HeartbeatInterval*6/5 {
		c.log.Warn("cluster: ResignHoldOff is shorter than the longest wait between a polling follower's attempts (1.2 × HeartbeatInterval): after Resign this node may take the lease back before such a follower tries; leave it at its default or raise it",
			"resign_hold_off", cfg.ResignHoldOff, "heartbeat_interval", cfg.HeartbeatInterval)
	}
	c.wit.pendingTx = map[string]provider.Querier{}
	c.workers = map[*worker]struct{}{}
	c.wake = make(chan struct{}, 1)
	c.lookupCtx, c.stopLookups = context.WithCancel(context.Background())
	c.seen = observed{free: true} // nothing observed yet: no event for a lease never held
	c.downCh = make(chan struct{})
	c.errNotLeader = fmt.Errorf("%w: node %q does not hold lease %q", ErrNotLeader, cfg.NodeID, cfg.LeaseName)
	c.errDown = fmt.Errorf("%w: node %q", ErrShutdown, cfg.NodeID)
	c.errDownFence = fmt.Errorf("%w: node %q, so its fencing token is stale (%w)", ErrShutdown, cfg.NodeID, ErrStaleFencingToken)
	if c.provider == nil {
		c.own = newDBProvider(cfg.DB, cfg.Dialect, cfg.TablePrefix, c.log)
		c.provider = c.own
	}
	c.fencer, _ = c.provider.(provider.Fencer)
	c.chains, _ = c.provider.(provider.ChainStore)
	c.state, _ = c.provider.(provider.StateStore)
	c.releaser, _ = c.provider.(provider.InstanceReleaser)
	c.members, _ = c.provider.(provider.MemberStore)
	switch {
	case c.chains == nil && len(cfg.Chains) > 0:
		return nil, c.errNoCapability("Config.Chains", "ChainStore")
	case c.chains == nil && cfg.WitnessFile != "":
		return nil, c.errNoCapability("Config.WitnessFile", "ChainStore")
	case c.state == nil && cfg.VaultKeyFingerprint != "":
		return nil, c.errNoCapability("Config.VaultKeys", "StateStore")
	}
	if sc, ok := c.provider.(provider.SchemaChecker); ok && cfg.SkipMigrations {
		if err := sc.CheckSchema(ctx); err != nil {
			return nil, fmt.Errorf("cluster: check lease store: %w", err)
		}
	} else if in, ok := c.provider.(provider.Initializer); ok && !cfg.SkipMigrations {
		if err := in.Init(ctx); err != nil {
			return nil, fmt.Errorf("cluster: prepare lease store: %w", err)
		}
	}
	c.events = &notifier{log: c.log}
	c.events.add(cfg.Events)
	if created != nil {
		created(c)
	}

	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	fail := func(err error) (*Cluster, error) {
		c.mu.Lock()
		c.stopped = true
		c.mu.Unlock()
		if c.own != nil {
			c.own.Close()
		}
		cancel()
		c.stopWatching()
		c.leave(ctx)
		c.events.close()
		return nil, err
	}
	// Refuse to join before campaigning: wrong keys or a rolled-back
	// database must never lead.
	if err := c.checkVaultKeys(ctx); err != nil {
		return fail(err)
	}
	if err := c.verifyIntegrity(ctx, 0); err != nil {
		return fail(err)
	}
	if c.members != nil {
		if err := c.join(ctx); err != nil && !errors.Is(err, ErrReadOnly) {
			c.mustJoin.Store(true) // a later heartbeat joins
		}
	}
	if cfg.Role == RoleLeader {
		first := c.step(ctx)
		if c.halted != nil {
			return fail(c.halted)
		}
		if w, ok := c.provider.(provider.ReleaseWatcher); ok && !cfg.PollOnly {
			c.watchReleases(ctx, w)
		}
		c.wg.Add(1)
		c.heartbeating.Store(true)
		go c.run(loopCtx, first)
	} else {
		c.wg.Add(1)
		c.heartbeating.Store(true)
		go c.watch(loopCtx)
	}
	c.log.InfoContext(ctx, "cluster: node started", "role", string(cfg.Role), "instance", c.instance,
		"lease_ttl", cfg.LeaseTTL, "heartbeat_interval", cfg.HeartbeatInterval, "fence_timeout", cfg.FenceTimeout)
	return c, nil
}

func newInstanceID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// IsLeader reports whether this node holds the lease and its trust window
// has not ended. It reads the monotonic clock itself, so it turns false on
// time even if the heartbeat goroutine has not run (a process resuming from
// a pause sees false on its first call). It is one atomic load and, on a
// node that holds a term, one clock read: it does not lock or allocate.
//
// IsLeader is an early check for routing and scheduling; only the database
// can refuse a stale leader's write.
func (c *Cluster) IsLeader() bool { return leads(c.until.Load()) }

// leads reports whether a trust window that ends at until (Cluster.until)
// is open. It reads the clock only when it must: not for 0, no term, nor
// for MaxInt64, the single leader of a process that never called Init.
func leads(until int64) bool {
	return until == math.MaxInt64 || until > 0 && mono() < until
}

// errShutdown is the one error every call returns after Shutdown.
func (c *Cluster) errShutdown() error { return c.errDown }

// liveTerm returns the term this node leads in, or nil when it holds none
// or its trust window has ended. The deadline read is t's only if t is
// still current after it (terms are never reused, a new term is stored
// before its deadline and an ended one's deadline is cleared first), so
// it never pairs one term with the next term's window.
func (c *Cluster) liveTerm() *term {
	if t := c.term.Load(); t != nil && mono() < c.until.Load() && c.term.Load() == t {
		return t
	}
	return nil
}

// heldTerm is liveTerm for the calls that write under the term: it returns
// an error wrapping ErrStaleFencingToken when there is none.
func (c *Cluster) heldTerm() (*term, error) {
	if t := c.liveTerm(); t != nil {
		return t, nil
	}
	if c.down.Load() {
		return nil, c.errDownFence
	}
	return nil, fmt.Errorf("%w: node %q does not hold lease %q", ErrStaleFencingToken, c.cfg.NodeID, c.cfg.LeaseName)
}

// FencingToken returns the fencing token of the term this node leads in,
// or 0 when [Cluster.IsLeader] is false.
func (c *Cluster) FencingToken() uint64 {
	if c.isDefault() {
		return FencingToken()
	}
	if t := c.liveTerm(); t != nil {
		return t.lease.FencingToken
	}
	return 0
}

// RequireLeader returns nil if this node leads, and otherwise an error that
// wraps [ErrNotLeader] and carries HTTP status 503 (see [HTTPStatus]).
func (c *Cluster) RequireLeader() error {
	if c.isDefault() {
		return RequireLeader()
	}
	if c.IsLeader() {
		return nil
	}
	if c.down.Load() {
		return c.errDown
	}
	return c.errNotLeader
}

// NodeID returns [Config.NodeID]. On [Default] it is [SingleNodeID] when
// [Init] was never called, and after a failed Init the NodeID Init was
// given, unless that NodeID was itself invalid.
func (c *Cluster) NodeID() string {
	if c.isDefault() {
		return stdNodeID()
	}
	return c.cfg.NodeID
}

// LeaseName returns the lease this node campaigns for ([Config.LeaseName],
// or [DefaultLeaseName]); on [Default], that of the member Init created,
// or DefaultLeaseName when none did.
func (c *Cluster) LeaseName() string {
	if c.isDefault() {
		if s := std.state.Load(); s != nil {
			if m := s.member(); m != nil {
				return m.LeaseName()
			}
		}
		return DefaultLeaseName
	}
	return c.cfg.LeaseName
}

// Endpoint returns [Config.Endpoint]; on [Default], "" when no member is
// running.
func (c *Cluster) Endpoint() string {
	if c.isDefault() {
		return stdEndpoint()
	}
	return c.cfg.Endpoint
}

// Clustered reports whether c is a member of a cluster. A Cluster made by
// [New] always is. On [Default] it is false until [Init] is called
// (single-node mode, where the process is the only worker: the leader,
// the owner of every lane, with a config version that never changes), and
// true from the moment Init is called, whether Init succeeded, is still
// running or failed, and after the member shut down. It says which mode
// the process is in, not whether it leads or is healthy: use it to choose,
// once, between single-node and clustered behaviour (for example whether a
// reload bumps the config version). It does no I/O.
func (c *Cluster) Clustered() bool {
	if c.isDefault() {
		return stdClustered()
	}
	return true
}

// CurrentLeader reads who holds the lease now. It returns nil and no error
// when no node holds an unexpired lease. Concurrent calls share one read.
func (c *Cluster) CurrentLeader(ctx context.Context) (*Leader, error) {
	if c.isDefault() {
		return stdCurrentLeader(ctx)
	}
	if c.down.Load() {
		return nil, c.errDown
	}
	// The shared read runs on a context of its own, bounded by one
	// heartbeat and ended by Shutdown (which waits for it), so that one
	// caller giving up does not fail the others.
	ch := c.lookups.DoChan("leader", func() (any, error) {
		c.lookupWork.add()
		defer c.lookupWork.done()
		rctx, cancel := context.WithTimeout(c.lookupCtx, c.cfg.HeartbeatInterval)
		defer cancel()
		return c.provider.Leader(rctx, c.cfg.LeaseName)
	})
	var res singleflight.Result
	select {
	case res = <-ch:
	case <-ctx.Done():
		return nil, fmt.Errorf("cluster: read leader of lease %q: %w", c.cfg.LeaseName, ctx.Err())
	}
	if res.Err != nil {
		return nil, fmt.Errorf("cluster: read leader of lease %q: %w", c.cfg.LeaseName, res.Err)
	}
	l, _ := res.Val.(*Leader)
	if l == nil {
		return nil, nil
	}
	cp := *l // callers sharing one read must not share one value
	return &cp, nil
}

// Notify causes the Cluster to send its transitions to ch, from the call
// on, in the order they happen, as [signal.Notify] sends signals. It does
// not block sending to ch: an event that finds ch full is dropped for ch,
// logged at Warn and counted in [Stats].EventsDropped, so the caller must
// give ch enough buffer for the events it may not receive at once (a
// buffer of 64 covers the bursts of a term's end and its lanes). The
// Cluster never closes ch; the last event is sent before [Cluster.Shutdown]
// returns, and none after, so the caller may then close it. The goroutine that receives from ch is the caller's, and may
// call Shutdown. Notify with a nil ch, or one already registered, does
// nothing. [Config.Events] registers a channel before New emits anything.
func (c *Cluster) Notify(ch chan<- Event) {
	if c.isDefault() {
		stdNotify(ch)
		return
	}
	c.events.add(ch)
}

// Shutdown ends this node's term, waits for its leader work to return,
// releases the lease if this node held it (first, before the rest of the
// teardown, since the followers wait for it), stops the heartbeat,
// sends the final lease-released event, and waits for every goroutine
// of the Cluster to exit. After Shutdown, IsLeader is false for good.
//
// The release waits for a renew of the term in flight to return (a renew
// answered after the release could extend the released lease), then runs
// on a context the caller cannot cancel, bounded by
// [Config.HeartbeatInterval], so a cancelled ctx still frees the lease;
// ctx bounds the waits for leader work and for a Shutdown already in
// progress. Shutdown is idempotent: a later call waits for the first to
// finish and returns its result. It never waits for the receivers of
// [Cluster.Notify], so the goroutine receiving events may call it.
func (c *Cluster) Shutdown(ctx context.Context) error {
	if c.isDefault() {
		return Shutdown(ctx)
	}
	c.shutMu.Lock()
	done := c.shutDone
	if done == nil {
		c.shutDone = make(chan struct{})
		first := c.shutDone
		c.shutMu.Unlock()
		c.shutdownErr = c.stop(ctx)
		close(first)
		return c.shutdownErr
	}
	c.shutMu.Unlock()
	select {
	case <-done:
		return c.shutdownErr
	case <-ctx.Done():
		return fmt.Errorf("cluster: waiting for Shutdown in progress: %w", ctx.Err())
	}
}

// retire is the first step of Shutdown, which the package-level Shutdown
// may take early: it ends this node's term and stops it campaigning, so
// IsLeader is false from here on. The term's lease is kept (retiring)
// until the leader work under it has stopped: no other node may start
// that work before. It returns the term the first call ended, if any.
func (c *Cluster) retire() *term {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return c.retired
	}
	c.stopped = true
	c.until.Store(0)
	if t := c.term.Load(); t != nil {
		c.retiring.Store(t)
		t.end()
		c.term.Store(nil)
		c.retired = t
	}
	return c.retired
}

// stop is the first Shutdown.
func (c *Cluster) stop(ctx context.Context) error {
	t := c.retire()
	c.down.Store(true)
	close(c.downCh)
	c.stopLookups()
	c.waitForWork(ctx, "Shutdown")

	// Stop the heartbeat and the lookups, and release without waiting for
	// them to exit: the followers are waiting for the release, and the rest
	// of the teardown concerns this node alone. It first lets a renew or
	// an attempt in flight finish, for a little while (stepGrace): a
	// statement cancelled in flight costs its connection (the driver closes
	// it), the release would then wait tens of milliseconds for a new one,
	// and an attempt cut off may have been granted unbeknown to us. The
	// listener stops after the release: closing its connection ends a
	// server process, which would compete with the release for the
	// database's CPU.
	var err error
	c.quiesce(t, stepGrace(c.cfg.HeartbeatInterval))
	c.cancel()
	if t != nil {
		err = c.release(ctx, t.lease)
		reason := ReasonShutdown
		if err == nil {
			c.stats.releases.Add(1)
			c.log.InfoContext(ctx, "cluster: lease released", "fencing_token", t.lease.FencingToken)
		} else {
			reason = ReasonReleaseFailed
			c.log.WarnContext(ctx, "cluster: release on shutdown failed; the lease expires after LeaseTTL",
				"fencing_token", t.lease.FencingToken, "lease_ttl", c.cfg.LeaseTTL, "err", err)
			err = fmt.Errorf("cluster: release lease %q on shutdown: %w", c.cfg.LeaseName, err)
		}
		c.emit(EventLeaseReleased, t.lease.FencingToken, reason)
	}
	c.stopWatching()

	c.lookupWork.wait(context.WithoutCancel(ctx)) // bounded by one heartbeat
	c.wg.Wait()
	c.retiring.Store(nil)
	c.mu.Lock()
	unsure := c.unsure
	c.mu.Unlock()
	if t == nil && unsure && c.releaser != nil {
		// An acquisition whose answer was lost may have granted a term
		// whose token we never learnt: release whatever we hold.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HeartbeatInterval)
		if rerr := c.releaser.ReleaseInstance(rctx, c.cfg.LeaseName, c.cfg.NodeID, c.instance); rerr != nil {
			err = fmt.Errorf("cluster: release lease %q on shutdown: %w", c.cfg.LeaseName, rerr)
		}
		cancel()
	}
	c.stopKeeper(ctx) // releases this node's lanes (lanes.go)
	c.leave(ctx)
	if c.own != nil {
		c.own.Close()
	}
	c.events.close()
	return err
}

func (c *Cluster) emit(kind EventKind, token uint64, reason Reason) {
	c.events.emit(Event{Kind: kind, NodeID: c.cfg.NodeID, At: time.Now(), FencingToken: token, Reason: reason})
}
