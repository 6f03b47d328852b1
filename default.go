package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
)

// SingleNodeID is the node ID reported when [Init] was never called.
const SingleNodeID = "single-node-local"

// The default instance behind the package-level functions. Its state (see
// the table in the package doc) is one immutable stdState, read with one
// atomic load; nil means Init was never called, and only then is the
// process a single leader.
var std struct {
	state atomic.Pointer[stdState]
	// until is what the package-level IsLeader reads, alone: MaxInt64
	// until Init is called (the single leader), then the member's
	// trust-window deadline (Cluster.until), which the member writes
	// itself, and 0 whenever no member answers.
	until atomic.Int64

	// mu orders the transitions and guards notify and init. It is never
	// held while waiting for anything, so any goroutine may call any
	// package-level function, Shutdown included, even during Init.
	mu      sync.Mutex
	notify  []chan<- Event    // registered by Notify for the next Init
	observe []func(Operation) // added by Observe for the next Init
	init    *stdInit          // the Init call under way, if any
	// changed is closed, and replaced, by every change of state: it wakes
	// package-level RunWhileLeader calls and ends single-node work.
	changed chan struct{}
	// single counts leader work running in single-node mode, which Init
	// and Shutdown wait for.
	single workCount
}

func init() { std.until.Store(math.MaxInt64) }

// setState moves the default instance to s. The caller holds std.mu.
func setState(s *stdState) {
	switch {
	case s == nil:
		std.until.Store(math.MaxInt64) // the tests' ResetDefault
	case s.c == nil:
		std.until.Store(0)
	}
	// Otherwise s.c writes std.until: its deadline while it answers, and
	// 0 from its retire on, which every path to the down state calls
	// before setting it.
	std.state.Store(s)
	if std.changed != nil {
		close(std.changed)
	}
	std.changed = make(chan struct{})
}

type stdKind int

const (
	stdStarting stdKind = iota + 1 // an Init call is under way
	stdRunning                     // Init succeeded
	stdFailed                      // the last Init failed
	stdDown                        // Shutdown was called, for good
)

// stdState is one state of the default instance. The errors are made
// once, when the state is entered, so the calls that return them do not
// allocate.
type stdState struct {
	kind stdKind
	// c is the member: the running one, the one Init is creating once it
	// exists, or, when down, the one Shutdown shut down.
	c      *Cluster
	nodeID string // reported by NodeID when c does not answer
	// single marks the state Shutdown entered when Init was never called:
	// the process was never a member, so Clustered stays false.
	single bool

	errNotLeader error  // returned by RequireLeader
	errFence     error  // returned by Fence and AdvanceTip
	errLeader    error  // returned by CurrentLeader
	reason       string // the discovery handler's "error"
}

// stdInit is an Init call under way.
type stdInit struct {
	c    *Cluster      // the member New is creating, once it exists; guarded by std.mu
	done chan struct{} // closed when Init returns
	// shutdownErr is the result of shutting c down when Shutdown was
	// called while Init ran; set before done closes.
	shutdownErr error
}

// member returns the Cluster that answers the package-level calls, or nil
// when none does.
func (s *stdState) member() *Cluster {
	if s.kind == stdRunning || s.kind == stdStarting {
		return s.c
	}
	return nil
}

func runningState(c *Cluster) *stdState { return &stdState{kind: stdRunning, c: c, nodeID: c.NodeID()} }

// startingState is the state while Init runs: until New has created the
// member the calls fail closed; from then on they answer for it, so a
// receiver of its first lease-acquired sees it lead.
func startingState(nodeID string, c *Cluster) *stdState {
	const why = "Init has not returned yet"
	return &stdState{
		kind:         stdStarting,
		c:            c,
		nodeID:       nodeID,
		errNotLeader: fmt.Errorf("%w: %s", ErrNotLeader, why),
		errFence:     fmt.Errorf("%w: %s", ErrStaleFencingToken, why),
		errLeader:    fmt.Errorf("cluster: read leader: %s", why),
		reason:       "initializing",
	}
}

func failedState(nodeID string, err error) *stdState {
	return &stdState{
		kind:         stdFailed,
		nodeID:       nodeID,
		errNotLeader: fmt.Errorf("%w: Init failed: %w", ErrNotLeader, err),
		errFence:     fmt.Errorf("%w: Init failed: %w", ErrStaleFencingToken, err),
		errLeader:    fmt.Errorf("cluster: read leader: Init failed: %w", err),
		reason:       "initialization failed",
	}
}

func downState(nodeID string, c *Cluster) *stdState {
	down := fmt.Errorf("%w: this process is shut down", ErrShutdown)
	return &stdState{
		kind:         stdDown,
		c:            c,
		nodeID:       nodeID,
		errNotLeader: down,
		errFence:     fmt.Errorf("%w: this process is shut down, so its fencing token is stale (%w)", ErrShutdown, ErrStaleFencingToken),
		errLeader:    down,
		reason:       "shut down",
	}
}

// configuredNodeID is what CurrentNodeID reports for cfg before a member
// exists: its NodeID when valid, and otherwise SingleNodeID.
func configuredNodeID(cfg Config) string {
	if cfg.NodeID == "" || checkText("NodeID", cfg.NodeID, maxNodeIDLen) != nil {
		return SingleNodeID
	}
	return cfg.NodeID
}

// Init makes this process a member of the cluster described by cfg, as
// [New] does, and routes the package-level functions to it. Until Init is
// called the process is a permanent single leader: [IsLeader] is true,
// [FencingToken] is 0, Default().NodeID() is "single-node-local", and no
// goroutine runs and no database is touched.
//
// Once Init is called the process is never a single leader again. While
// it runs, and after it fails, the package-level functions fail closed:
// IsLeader is false and the errors wrap Init's (see the package doc). A
// failed Init may be retried; a second call after one succeeded, or during
// one, returns [ErrAlreadyInitialized]. If [Shutdown] is called while Init
// runs, Init shuts down the member it created and returns an error
// wrapping [ErrShutdown].
func Init(ctx context.Context, cfg Config) error {
	std.mu.Lock()
	s := std.state.Load()
	switch {
	case std.init != nil:
		std.mu.Unlock()
		return fmt.Errorf("%w: another Init call is under way", ErrAlreadyInitialized)
	case s != nil && (s.kind == stdRunning || s.kind == stdDown):
		std.mu.Unlock()
		return fmt.Errorf("%w: Init may be called once per process", ErrAlreadyInitialized)
	}
	in := &stdInit{done: make(chan struct{})}
	defer close(in.done)
	std.init = in
	nodeID := configuredNodeID(cfg)
	setState(startingState(nodeID, nil)) // ends single-node work
	std.mu.Unlock()
	waitSingle(ctx, "Init")

	c, err := newCluster(ctx, cfg, &std.until, func(c *Cluster) {
		// Called before New emits anything, so the channels get every event.
		std.mu.Lock()
		defer std.mu.Unlock()
		for _, ch := range std.notify {
			c.events.add(ch)
		}
		for _, f := range std.observe {
			c.Observe(f)
		}
		in.c = c
		if std.state.Load().kind == stdStarting {
			setState(startingState(nodeID, c))
		} else {
			c.retire() // Shutdown was called: never campaign
		}
	})

	std.mu.Lock()
	std.init = nil
	switch {
	case std.state.Load().kind == stdDown:
		// Shutdown was called while Init ran, and waits for Init to shut
		// c down.
		if err != nil {
			std.mu.Unlock()
			return err
		}
		setState(downState(c.NodeID(), c))
		std.mu.Unlock()
		in.shutdownErr = c.Shutdown(ctx)
		return errors.Join(fmt.Errorf("%w: Shutdown was called while Init ran", ErrShutdown), in.shutdownErr)
	case err != nil:
		setState(failedState(nodeID, err))
		std.mu.Unlock()
		return err
	}
	std.notify, std.observe = nil, nil
	setState(runningState(c))
	std.mu.Unlock()
	return nil
}

// IsLeader reports whether this process leads; see [Cluster.IsLeader]. It
// is true when [Init] was never called, false while Init runs and after it
// failed, and false for good after [Shutdown].
func IsLeader() bool { return leads(std.until.Load()) }

// FencingToken returns the token of the term this process leads in, or 0
// when it does not lead or [Init] was never called.
func FencingToken() uint64 {
	if s := std.state.Load(); s != nil {
		if c := s.member(); c != nil {
			return c.FencingToken()
		}
	}
	return 0
}

// RequireLeader returns nil if this process leads, and otherwise an error
// wrapping [ErrNotLeader] that carries HTTP status 503. After a failed
// [Init] the error also wraps Init's error.
func RequireLeader() error {
	s := std.state.Load()
	if s == nil {
		return nil
	}
	if c := s.member(); c != nil {
		return c.RequireLeader()
	}
	return s.errNotLeader
}

// stdClustered reports whether this process was made a member of a cluster:
// false until [Init] is called (single-node mode, where it is the only
// worker: the leader, the owner of every lane, with a config version that
// never changes), and true from the moment Init is called, whether it
// succeeded, is still running, failed, or the member has shut down. It
// says which mode the process is in, not whether it leads or is healthy:
// use it to choose, once, between single-node and clustered behaviour
// (for example whether a reload bumps the config version, or whether
// recovery may assume no other node is working). It does no I/O. A
// [*Cluster] made by [New] is always a member of a cluster.
func stdClustered() bool {
	s := std.state.Load()
	return s != nil && !s.single
}

// stdNodeID returns this process's node ID, or "single-node-local"
// when [Init] was never called. After a failed Init it returns the NodeID
// Init was given, unless that NodeID was itself invalid.
func stdNodeID() string {
	s := std.state.Load()
	if s == nil {
		return SingleNodeID
	}
	if c := s.member(); c != nil {
		return c.NodeID()
	}
	return s.nodeID
}

// stdEndpoint returns this process's configured endpoint, or "" when none was
// configured or no member is running.
func stdEndpoint() string {
	if s := std.state.Load(); s != nil {
		if c := s.member(); c != nil {
			return c.Endpoint()
		}
	}
	return ""
}

// stdCurrentLeader reads who leads; see [Cluster.CurrentLeader]. When [Init]
// was never called it returns this process as a leader whose lease never
// expires (a zero LeaseExpiresAt). After a failed Init it returns an error
// wrapping Init's, and after [Shutdown] [ErrShutdown].
func stdCurrentLeader(ctx context.Context) (*Leader, error) {
	s := std.state.Load()
	if s == nil {
		return &Leader{NodeID: SingleNodeID}, nil
	}
	if c := s.member(); c != nil {
		return c.CurrentLeader(ctx)
	}
	return nil, s.errLeader
}

// stdNotify registers ch with the default instance; see
// [Cluster.Notify]. Channels registered before [Init], or after one
// failed, are given to the member Init creates before it emits any
// event. In single-node mode no transition ever happens; after [Shutdown]
// none will.
func stdNotify(ch chan<- Event) {
	if ch == nil {
		return
	}
	std.mu.Lock()
	defer std.mu.Unlock()
	s := std.state.Load()
	switch {
	case s != nil && s.kind == stdRunning:
		s.c.Notify(ch)
	case s != nil && s.kind == stdDown:
	default:
		if !slices.Contains(std.notify, ch) {
			std.notify = append(std.notify, ch)
		}
		if std.init != nil && std.init.c != nil {
			std.init.c.Notify(ch)
		}
	}
}

// Shutdown shuts the default instance down; see [Cluster.Shutdown]. It
// ends the process's membership for good, whatever the state: afterwards
// [IsLeader] is false, the errors say the process is shut down, and [Init]
// returns [ErrAlreadyInitialized].
//
// Called while Init runs, it waits for Init to shut down the member it is
// creating (bounded by ctx); Init never waits for the receivers of
// [Cluster.Notify], so they may call Shutdown at any time.
func Shutdown(ctx context.Context) error {
	std.mu.Lock()
	s := std.state.Load()
	var c *Cluster
	switch {
	case s == nil:
		d := downState(SingleNodeID, nil)
		d.single = true
		setState(d)
	case s.kind == stdDown:
		c = s.c
	case s.kind == stdRunning:
		c = s.c
		c.retire()
		setState(downState(s.nodeID, c))
	default: // starting or failed
		if s.c != nil {
			s.c.retire() // Init shuts it down when New returns
		}
		setState(downState(s.nodeID, nil))
	}
	in := std.init
	std.mu.Unlock()

	if c != nil {
		return c.Shutdown(ctx)
	}
	if in == nil {
		waitSingle(ctx, "Shutdown")
		return nil
	}
	// Init is under way and shuts down what it creates when New returns.
	select {
	case <-in.done:
		return in.shutdownErr
	case <-ctx.Done():
		return fmt.Errorf("cluster: waiting for Init under way to shut down: %w", ctx.Err())
	}
}

// DiscoveryHandler returns the default instance's discovery handler; see
// [Cluster.DiscoveryHandler]. It may be mounted before [Init]: each request
// uses the instance current at that time, answers 200 for the single node
// when Init was never called, and 503 with "leader":null and a short
// "error" (never Init's error text) while Init runs, after it failed and
// after [Shutdown].
func DiscoveryHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := std.state.Load()
		if s == nil {
			writeDiscovery(w, r, discoveryBody{
				Leader: &Leader{NodeID: SingleNodeID},
				Self:   discoverySelf{NodeID: SingleNodeID, IsLeader: true},
			})
			return
		}
		if c := s.member(); c != nil {
			c.DiscoveryHandler().ServeHTTP(w, r)
			return
		}
		writeDiscovery(w, r, discoveryBody{Self: discoverySelf{NodeID: s.nodeID}, Error: s.reason})
	})
}

// stdFence is Fence on the default instance: when Init was never called
// the process is the only writer and it returns 0 without touching tx;
// while Init runs, after it failed and after Shutdown it returns an error
// wrapping ErrStaleFencingToken (and Init's error, after a failed Init).
func stdFence(ctx context.Context, tx Tx) (uint64, error) {
	if _, err := querierOf("Fence", tx); err != nil {
		return 0, err
	}
	s := std.state.Load()
	if s == nil {
		return 0, nil
	}
	if c := s.member(); c != nil {
		return c.Fence(ctx, tx)
	}
	return 0, s.errFence
}

// stdAdvanceTip is AdvanceTip on the default instance: before Init there
// is no chain to advance; while Init runs, after it failed and after
// Shutdown it returns the error Fence would.
func stdAdvanceTip(ctx context.Context, tx Tx, chain string, counter uint64, rowHash []byte) error {
	if _, err := querierOf("AdvanceTip", tx); err != nil {
		return err
	}
	s := std.state.Load()
	if s == nil {
		return fmt.Errorf("%w: chain %q: call Init with Config.Chains before AdvanceTip", ErrInvalidConfig, chain)
	}
	if c := s.member(); c != nil {
		return c.AdvanceTip(ctx, tx, chain, counter, rowHash)
	}
	return s.errFence
}

// stdRunWhileLeader runs leader-only work with the default instance; see
// [Cluster.RunWhileLeader]. When [Init] was never called the process is
// the leader for good: fn runs once with token 0, and its context is
// cancelled when ctx is done, when Init is called (which waits for fn,
// within its own context, before it campaigns) or at [Shutdown] (which
// waits for it likewise). While Init runs, and after it failed, fn does
// not run: RunWhileLeader waits for an Init to succeed. After Shutdown it
// returns an error wrapping [ErrShutdown].
func stdRunWhileLeader(ctx context.Context, fn func(ctx context.Context, token uint64) error) error {
	if fn == nil {
		return fmt.Errorf("%w: RunWhileLeader needs a non-nil fn", ErrInvalidConfig)
	}
	return stdWork(ctx, fn, func(c *Cluster) error { return c.RunWhileLeader(ctx, fn) })
}

// stdWork is the state loop of the default instance's work: in
// single-node mode it runs single (see runSingle) until ctx is done or
// the state changes; once a member runs it returns member's result; after
// Shutdown, the shut-down error; while Init runs or after it failed, it
// waits for the next state.
func stdWork(ctx context.Context, single func(context.Context, uint64) error, member func(*Cluster) error) error {
	for {
		std.mu.Lock()
		s := std.state.Load()
		if std.changed == nil {
			std.changed = make(chan struct{})
		}
		changed := std.changed
		if s == nil {
			std.single.add() // under mu: Init and Shutdown see it once they change the state
		}
		std.mu.Unlock()
		switch {
		case s == nil:
			runSingle(ctx, changed, single)
		case s.kind == stdRunning:
			return member(s.c)
		case s.kind == stdDown:
			return s.errNotLeader
		}
		// Starting or failed, or single-node work that returned: wait for
		// the next state.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// runSingle runs fn for the single node's endless term, until ctx is done
// or the default instance changes state.
func runSingle(ctx context.Context, changed <-chan struct{}, fn func(context.Context, uint64) error) {
	defer std.single.done()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-changed:
			cancel()
		case <-fctx.Done():
		}
	}()
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return fn(fctx, 0)
	}()
	if err != nil && !errors.Is(err, context.Canceled) {
		defaultLogger().Error("cluster: leader work failed; in single-node mode it runs again only after Init", "err", err)
	}
}

// waitSingle waits, within ctx, for single-node work to stop.
func waitSingle(ctx context.Context, what string) {
	if n, err := std.single.wait(ctx); err != nil {
		defaultLogger().WarnContext(ctx, "cluster: single-node leader work ignored its context past the "+what+" deadline", "running", n, "err", err)
	}
}

// stdResign ends the default instance's term; see [Cluster.Resign]. When
// [Init] was never called, while Init runs and after it failed it does
// nothing and returns nil (a single node cannot step down: there is no
// other); after [Shutdown] it returns an error wrapping [ErrShutdown].
func stdResign(ctx context.Context) error {
	s := std.state.Load()
	switch {
	case s == nil:
		return nil
	case s.kind == stdRunning:
		return s.c.Resign(ctx)
	case s.kind == stdDown:
		return s.errNotLeader
	}
	return nil
}

// stdHealthHandler returns the default instance's liveness handler; see
// [Cluster.HealthHandler]. It may be mounted before [Init]: when Init was
// never called it answers 200 for the single node; while Init runs, after
// it failed and after [Shutdown] it answers 503 with the state as reason.
func stdHealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := std.state.Load()
		if c := memberOf(s); c != nil {
			c.HealthHandler().ServeHTTP(w, r)
			return
		}
		if !probeMethod(w, r) {
			return
		}
		if s == nil {
			writeJSON(w, r, http.StatusOK, healthBody{Status: "ok", NodeID: SingleNodeID, Leader: true})
			return
		}
		writeJSON(w, r, http.StatusServiceUnavailable, healthBody{Status: "unhealthy", NodeID: s.nodeID, Reason: s.reason})
	})
}

// stdLeaderCheckHandler returns the default instance's leader check; see
// [Cluster.LeaderCheckHandler]. When [Init] was never called the single
// node leads (200, token 0).
func stdLeaderCheckHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !probeMethod(w, r) {
			return
		}
		s := std.state.Load()
		if s == nil {
			serveLeaderCheck(w, r, true, 0)
			return
		}
		token := FencingToken()
		serveLeaderCheck(w, r, IsLeader(), token)
	})
}

// stdRequireLeaderMiddleware gates next on the default instance's leadership;
// see [Cluster.RequireLeaderMiddleware]. When [Init] was never called
// every request passes.
func stdRequireLeaderMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := std.state.Load()
		if c := memberOf(s); c != nil {
			c.RequireLeaderMiddleware(next).ServeHTTP(w, r)
			return
		}
		if IsLeader() {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", "1")
		http.Error(w, "this node is not the leader", http.StatusServiceUnavailable)
	})
}

// stdMembers lists the members of the default instance's cluster; see
// [Cluster.Members]. When [Init] was never called it returns the single
// node; while Init runs, after it failed and after [Shutdown] it returns
// the error CurrentLeader would.
func stdMembers(ctx context.Context) ([]Member, error) {
	s := std.state.Load()
	if s == nil {
		host, _ := os.Hostname()
		return []Member{{NodeID: SingleNodeID, Host: host, PID: os.Getpid(), Status: "active", Live: true, Leader: true}}, nil
	}
	if c := s.member(); c != nil {
		return c.Members(ctx)
	}
	return nil, s.errLeader
}

// stdMembersHandler serves stdMembers as JSON; see [Cluster.MembersHandler].
func stdMembersHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := std.state.Load()
		if c := memberOf(s); c != nil {
			c.MembersHandler().ServeHTTP(w, r)
			return
		}
		if !probeMethod(w, r) {
			return
		}
		ms, err := stdMembers(r.Context())
		if err != nil {
			writeJSON(w, r, http.StatusServiceUnavailable, map[string]string{"error": "membership lookup failed"})
			return
		}
		writeJSON(w, r, http.StatusOK, struct {
			Members []Member `json:"members"`
		}{ms})
	})
}

// memberOf is s.member(), nil for a nil state.
func memberOf(s *stdState) *Cluster {
	if s == nil {
		return nil
	}
	return s.member()
}

// Default returns the default instance: the *Cluster that [Init] makes a
// member of a cluster and that the package-level functions act on. It
// always returns the same *Cluster, so it may be kept from before Init.
//
// Its methods act on the member Init created, and otherwise:
//   - when Init was never called, they answer as the permanent single
//     leader and touch no database: IsLeader is true, Fence and ClaimLane
//     return token 0 without touching tx, every lane is this process's,
//     RunWhileLeader runs its function with token 0, the config version is
//     0, Members lists this process, and the handlers answer 200;
//   - while Init runs, after it failed, and after [Shutdown], they fail
//     closed: IsLeader is false, the errors wrap [ErrNotLeader] or
//     [ErrStaleFencingToken] (and Init's error, or [ErrShutdown]), and
//     the handlers answer 503. Channels registered with Notify before
//     Init, or after one failed, are given to the member Init creates
//     before it emits any event.
//
// Default().Shutdown is [Shutdown], and Default().Clustered reports
// whether Init was ever called.
func Default() *Cluster { return defaultCluster }

// defaultCluster is the Cluster Default returns. It holds no state of its
// own: IsLeader reads std.until, which it shares, and every other
// exported method begins by asking isDefault and then answers from the
// default instance's state (std).
var defaultCluster = &Cluster{until: &std.until}

// isDefault reports whether c is the default instance.
func (c *Cluster) isDefault() bool { return c == defaultCluster }

// stdStats is Stats on the default instance: the member's, or, when Init
// was never called, the single leader's.
func stdStats() Stats {
	s := std.state.Load()
	if c := memberOf(s); c != nil {
		return c.Stats()
	}
	if s != nil && s.c != nil && s.kind == stdDown {
		return s.c.Stats()
	}
	return Stats{Leader: s == nil, LastContact: -1}
}

// The package-level twins of the lane and config-version methods, for the
// default instance (see default.go and the package doc's table of its
// states). In single-node mode (Init never called) this process is the
// only worker: it owns every lane, claims return token 0 without touching
// the database, and the config version is 0 and never changes. While Init
// runs, after it failed and after Shutdown they fail closed, as Fence does.

// stdClaimLane is ClaimLane on the default instance: when Init was never
// called it returns 0 without touching tx; while Init runs, after it
// failed and after Shutdown it returns the error Fence would.
func stdClaimLane(ctx context.Context, tx Tx, key string) (uint64, error) {
	if _, err := querierOf("ClaimLane", tx); err != nil {
		return 0, err
	}
	s := std.state.Load()
	if s == nil {
		return 0, checkLaneKey(key)
	}
	if c := s.member(); c != nil {
		return c.ClaimLane(ctx, tx, key)
	}
	return 0, s.errFence
}

// stdOwnsLane reports whether this process believes it owns lane key; see
// [Cluster.OwnsLane]. It is true for every key when [Init] was never
// called, and false while Init runs, after it failed and after
// [Shutdown].
func stdOwnsLane(key string) bool {
	s := std.state.Load()
	if s == nil {
		return true
	}
	if c := s.member(); c != nil {
		return c.OwnsLane(key)
	}
	return false
}

// stdLanes returns the lanes this process believes it owns; see
// [Cluster.Lanes]. It returns nil when [Init] was never called (every lane
// is this process's, and none was named), while Init runs, after it failed
// and after [Shutdown].
func stdLanes() []string {
	if c := memberOf(std.state.Load()); c != nil {
		return c.Lanes()
	}
	return nil
}

// stdReleaseLane releases lane key; see [Cluster.ReleaseLane]. It does
// nothing and returns nil when [Init] was never called, while Init runs
// and after it failed (nothing is held), and returns an error wrapping
// [ErrShutdown] after [Shutdown].
func stdReleaseLane(ctx context.Context, key string) error {
	s := std.state.Load()
	switch {
	case s == nil:
		return nil
	case s.kind == stdDown:
		return s.errNotLeader
	}
	if c := s.member(); c != nil {
		return c.ReleaseLane(ctx, key)
	}
	return nil
}

// stdLaneOwner reads who holds lane key now; see [Cluster.LaneOwner]. When
// [Init] was never called this process holds every lane for good: it
// returns, without I/O, a Lane naming key and [SingleNodeID] as its
// Holder, with token 0 and a zero ExpiresAt (it never expires). While
// Init runs, after it failed and after [Shutdown] it returns the error
// CurrentLeader would.
func stdLaneOwner(ctx context.Context, key string) (*Lane, error) {
	s := std.state.Load()
	if s == nil {
		if err := checkLaneKey(key); err != nil {
			return nil, err
		}
		return &Lane{Key: key, Holder: SingleNodeID}, nil
	}
	if c := s.member(); c != nil {
		return c.LaneOwner(ctx, key)
	}
	return nil, s.errLeader
}

// stdConfigVersion reads the cluster's config version; see
// [Cluster.ConfigVersion]. When [Init] was never called it is 0; while
// Init runs, after it failed and after [Shutdown] it returns the error
// CurrentLeader would.
func stdConfigVersion(ctx context.Context) (uint64, error) {
	s := std.state.Load()
	if s == nil {
		return 0, nil
	}
	if c := s.member(); c != nil {
		return c.ConfigVersion(ctx)
	}
	return 0, s.errLeader
}

// stdConfigVersionCached returns the config version last seen; see
// [Cluster.ConfigVersionCached]. It is 0 when [Init] was never called,
// while Init runs and after it failed; after [Shutdown] it is the last
// version the member saw.
func stdConfigVersionCached() uint64 {
	if c := memberOf(std.state.Load()); c != nil {
		return c.ConfigVersionCached()
	}
	if s := std.state.Load(); s != nil && s.kind == stdDown && s.c != nil {
		return s.c.conf.version.Load()
	}
	return 0
}

// stdBumpConfigVersion increments the cluster's config version; see
// [Cluster.BumpConfigVersion]. When [Init] was never called there is no
// cluster to tell: it bumps nothing and returns 0. While Init runs, after
// it failed and after [Shutdown] it returns the error CurrentLeader
// would.
func stdBumpConfigVersion(ctx context.Context) (uint64, error) {
	s := std.state.Load()
	if s == nil {
		return 0, nil
	}
	if c := s.member(); c != nil {
		return c.BumpConfigVersion(ctx)
	}
	return 0, s.errLeader
}

// stdWorkLanes is WorkLanes on the default instance. In single-node mode
// (Init never called) this process owns every lane: fn runs for each key
// with token 0 until ctx is done or Init begins, and is not called again
// for a key whose fn returned before that. Once Init succeeds it works
// the lanes as the member; after Shutdown it returns an error wrapping
// [ErrShutdown].
func stdWorkLanes(ctx context.Context, keys []string, fn func(ctx context.Context, lane string, token uint64) error) error {
	if err := checkWorkLanes(keys, fn); err != nil {
		return err
	}
	single := func(ctx context.Context, _ uint64) error {
		var wg sync.WaitGroup
		for _, key := range keys {
			wg.Go(func() {
				if err := callLaneWork(ctx, key, 0, fn); err != nil && ctx.Err() == nil {
					defaultLogger().Error("cluster: lane work failed; in single-node mode it runs again only after Init", "lane", key, "err", err)
				}
			})
		}
		wg.Wait()
		return nil
	}
	return stdWork(ctx, single, func(c *Cluster) error { return c.WorkLanes(ctx, keys, fn) })
}

// stdObserve adds f to the default instance's observers; see
// [Cluster.Observe]. Before [Init], or after one failed, f is added to the
// member Init creates before it makes any provider call.
func stdObserve(f func(Operation)) {
	std.mu.Lock()
	defer std.mu.Unlock()
	s := std.state.Load()
	switch {
	case s != nil && s.kind == stdRunning:
		s.c.Observe(f)
	case s != nil && s.kind == stdDown:
	default:
		std.observe = append(std.observe, f)
		if std.init != nil && std.init.c != nil {
			std.init.c.Observe(f)
		}
	}
}
