package cluster

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
)

// SingleNodeID is the node ID reported when [Init] was never called.
const SingleNodeID = "single-node-local"

// The default instance behind the package-level functions.
var std struct {
	mu       sync.Mutex
	c        atomic.Pointer[Cluster]
	down     atomic.Bool
	handlers []func(Event)
}

var errSingleShutdown = fmt.Errorf("%w: the single-node process is shut down", ErrNotLeader)

// Init makes this process a member of the cluster described by cfg, as
// [New] does, and routes the package-level functions to it. Until Init is
// called the process is a permanent single leader: [IsLeader] is true,
// [FencingToken] is 0, [CurrentNodeID] is "single-node-local", and no
// goroutine runs and no database is touched.
//
// A second call returns [ErrAlreadyInitialized]; a call that failed may be
// retried.
func Init(ctx context.Context, cfg Config) error {
	std.mu.Lock()
	defer std.mu.Unlock()
	if std.c.Load() != nil || std.down.Load() {
		return fmt.Errorf("%w: Init may be called once per process", ErrAlreadyInitialized)
	}
	c, err := newCluster(ctx, cfg, std.handlers)
	if err != nil {
		return err
	}
	std.handlers = nil
	std.c.Store(c)
	return nil
}

// IsLeader reports whether this process leads; see [Cluster.IsLeader]. It
// is true when [Init] was never called, and false for good after [Shutdown].
func IsLeader() bool {
	if c := std.c.Load(); c != nil {
		return c.IsLeader()
	}
	return !std.down.Load()
}

// FencingToken returns the token of the term this process leads in, or 0
// when it does not lead or [Init] was never called.
func FencingToken() uint64 {
	if c := std.c.Load(); c != nil {
		return c.FencingToken()
	}
	return 0
}

// RequireLeader returns nil if this process leads, and otherwise an error
// wrapping [ErrNotLeader] that carries HTTP status 503.
func RequireLeader() error {
	if c := std.c.Load(); c != nil {
		return c.RequireLeader()
	}
	if std.down.Load() {
		return errSingleShutdown
	}
	return nil
}

// CurrentNodeID returns this process's node ID, or "single-node-local"
// when [Init] was never called.
func CurrentNodeID() string {
	if c := std.c.Load(); c != nil {
		return c.NodeID()
	}
	return SingleNodeID
}

// Endpoint returns this process's configured endpoint, or "" when none was
// configured or [Init] was never called.
func Endpoint() string {
	if c := std.c.Load(); c != nil {
		return c.Endpoint()
	}
	return ""
}

// CurrentLeader reads who leads; see [Cluster.CurrentLeader]. When [Init]
// was never called it returns this process as a leader whose lease never
// expires (a zero LeaseExpiresAt).
func CurrentLeader(ctx context.Context) (*Leader, error) {
	if c := std.c.Load(); c != nil {
		return c.CurrentLeader(ctx)
	}
	if std.down.Load() {
		return nil, ErrShutdown
	}
	return &Leader{NodeID: SingleNodeID}, nil
}

// OnTransition registers f with the default instance; see
// [Cluster.OnTransition]. Handlers registered before [Init] are attached
// when it succeeds. In single-node mode no transition ever happens.
func OnTransition(f func(Event)) {
	if f == nil {
		return
	}
	std.mu.Lock()
	defer std.mu.Unlock()
	if c := std.c.Load(); c != nil {
		c.OnTransition(f)
		return
	}
	std.handlers = append(std.handlers, f)
}

// Shutdown shuts the default instance down; see [Cluster.Shutdown]. When
// [Init] was never called it only ends the single-node leadership. In both
// cases [IsLeader] is false afterwards for good.
func Shutdown(ctx context.Context) error {
	std.mu.Lock()
	std.down.Store(true)
	c := std.c.Load()
	std.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.Shutdown(ctx)
}

// DiscoveryHandler returns the default instance's discovery handler; see
// [Cluster.DiscoveryHandler]. It may be mounted before [Init]: each request
// uses the instance current at that time, or answers for the single node.
func DiscoveryHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := std.c.Load(); c != nil {
			c.DiscoveryHandler().ServeHTTP(w, r)
			return
		}
		serveSingle(w, r, !std.down.Load())
	})
}

// Fence fences tx with the default instance; see [Cluster.Fence]. When
// [Init] was never called the process is the only writer and Fence returns
// nil without touching tx; after [Shutdown] it returns an error wrapping
// [ErrStaleFencingToken].
func Fence(ctx context.Context, tx DBTX) error {
	_, err := FenceToken(ctx, tx)
	return err
}

// FenceToken fences tx with the default instance and returns the token it
// verified; see [Cluster.FenceToken]. When [Init] was never called it
// returns 0 and nil.
func FenceToken(ctx context.Context, tx DBTX) (uint64, error) {
	if c := std.c.Load(); c != nil {
		return c.FenceToken(ctx, tx)
	}
	if std.down.Load() {
		return 0, fmt.Errorf("%w: the single-node process is shut down", ErrStaleFencingToken)
	}
	return 0, nil
}

// AdvanceTip records a chain tip with the default instance; see
// [Cluster.AdvanceTip]. Before [Init] there is no chain to advance.
func AdvanceTip(ctx context.Context, tx DBTX, chain string, counter uint64, rowHash []byte) error {
	if c := std.c.Load(); c != nil {
		return c.AdvanceTip(ctx, tx, chain, counter, rowHash)
	}
	return fmt.Errorf("%w: chain %q: call Init with Config.Chains before AdvanceTip", ErrInvalidConfig, chain)
}

// serveSingle answers for a process on which Init was never called.
func serveSingle(w http.ResponseWriter, r *http.Request, up bool) {
	body := discoveryBody{Self: discoverySelf{NodeID: SingleNodeID, IsLeader: up}}
	if up {
		body.Leader = &Leader{NodeID: SingleNodeID}
	}
	writeDiscovery(w, r, body)
}
