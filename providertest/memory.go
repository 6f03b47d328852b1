package providertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/provider"
)

// ErrDisconnected is returned by the calls of a node that
// [Memory.Disconnect] cut off from the store. A Cluster treats it as it
// treats an unreachable database.
var ErrDisconnected = errors.New("providertest: node disconnected from the store")

// Memory is a [provider.Provider] that keeps its leases in memory: a store
// for tests, which every node of a test shares by setting the same Memory
// as its [cluster.Config.Provider]. It passes the conformance suite ([Run])
// and keeps the whole Provider contract: expiry by its clock, fencing
// tokens that strictly increase per lease name and never start again (not
// after a Release, an expiry or [Memory.Expire]), and Renew and Release
// that match the term's name, holder, instance and token. It keeps lanes
// and config versions as well (see [Memory.ClaimLane]).
//
// Its methods are safe for concurrent use. Each returns ctx's error when
// ctx is done before it starts, as a store that was never reached would.
// The zero Memory is an empty store on [time.Now]; [NewMemory] sets
// another clock.
type Memory struct {
	clock func() time.Time

	mu           sync.Mutex
	leases       map[string]*memLease // by name; kept after expiry, for the token
	disconnected map[string]bool      // by NodeID

	// Lanes and config versions (memory_lanes.go), made by laneState.
	lanes   map[laneID]*memLane             // kept after a claim ends, for the token
	takers  map[string]map[string]time.Time // by scope and instance: when a member that takes lanes was last seen
	configs map[string]uint64               // by scope
	nodes   map[string]string               // the NodeID of each instance seen, for Disconnect
}

// memLease is the latest term of one lease name.
type memLease struct {
	holder, instance, endpoint string
	token                      uint64
	expiresAt                  time.Time // free once the clock reaches it
}

// held reports whether l is a term that has not expired at now.
func (l *memLease) held(now time.Time) bool { return l != nil && now.Before(l.expiresAt) }

// is reports whether l is the term that x describes.
func (l *memLease) is(x provider.Lease) bool {
	return l.holder == x.Holder && l.instance == x.Instance && l.token == x.FencingToken
}

func (l *memLease) lease(name string) provider.Lease {
	return provider.Lease{Name: name, Holder: l.holder, Instance: l.instance, Endpoint: l.endpoint,
		FencingToken: l.token, ExpiresAt: l.expiresAt}
}

var (
	_ provider.Provider         = (*Memory)(nil)
	_ provider.InstanceReleaser = (*Memory)(nil)
)

// NewMemory returns an empty Memory whose leases expire by clock, or by
// [time.Now] when clock is nil. Pass a [Clock]'s Now method to decide in
// the test when time passes. Memory calls clock with its lock held, so
// clock must not call the Memory.
func NewMemory(clock func() time.Time) *Memory {
	return &Memory{clock: clock}
}

// now reads the clock. The caller holds m.mu.
func (m *Memory) now() time.Time {
	if m.clock == nil {
		return time.Now()
	}
	return m.clock()
}

// check returns the error for a call by node on ctx, if it must fail.
func (m *Memory) check(ctx context.Context, node, op, name string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("providertest: %s lease %q: %w", op, name, err)
	}
	if m.disconnected[node] { // reading a nil map is fine
		return fmt.Errorf("%w: node %q cannot %s lease %q", ErrDisconnected, node, op, name)
	}
	return nil
}

// Acquire implements [provider.Provider]: it grants req a new term of the
// lease, with the next fencing token, unless another term holds the lease
// unexpired (then it returns a [*cluster.LeaseHeldError]). req.TTL must be
// positive.
func (m *Memory) Acquire(ctx context.Context, req provider.LeaseRequest) (provider.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx, req.Holder, "acquire", req.Name); err != nil {
		return provider.Lease{}, err
	}
	if req.TTL <= 0 {
		return provider.Lease{}, fmt.Errorf("providertest: acquire lease %q for %v: the TTL must be positive", req.Name, req.TTL)
	}
	m.laneState()
	m.nodes[req.Instance] = req.Holder
	now := m.now()
	l := m.leases[req.Name]
	if l.held(now) {
		return provider.Lease{}, &cluster.LeaseHeldError{Holder: l.holder, Instance: l.instance, Endpoint: l.endpoint,
			FencingToken: l.token, ExpiresAt: l.expiresAt, Remaining: l.expiresAt.Sub(now)}
	}
	if l == nil {
		if m.leases == nil {
			m.leases = map[string]*memLease{}
		}
		l = &memLease{}
		m.leases[req.Name] = l
	}
	l.holder, l.instance, l.endpoint = req.Holder, req.Instance, req.Endpoint
	l.token++
	l.expiresAt = now.Add(req.TTL)
	return l.lease(req.Name), nil
}

// Renew implements [provider.Provider]: it moves the expiry of the term
// described by l to ttl from now, or returns [cluster.ErrLeaseLost] when
// that term no longer holds the lease. ttl must be positive.
func (m *Memory) Renew(ctx context.Context, l provider.Lease, ttl time.Duration) (provider.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx, l.Holder, "renew", l.Name); err != nil {
		return l, err
	}
	if ttl <= 0 {
		return l, fmt.Errorf("providertest: renew lease %q for %v: the TTL must be positive", l.Name, ttl)
	}
	now := m.now()
	cur := m.leases[l.Name]
	if !cur.held(now) || !cur.is(l) {
		return l, fmt.Errorf("%w: lease %q is no longer held by node %q with fencing token %d", cluster.ErrLeaseLost, l.Name, l.Holder, l.FencingToken)
	}
	cur.expiresAt = now.Add(ttl)
	return cur.lease(l.Name), nil
}

// Release implements [provider.Provider]: it ends the term described by l
// at once, keeping its token, if that term still holds the lease. A
// FencingToken of 0 in l ends any term of l's holder and instance.
func (m *Memory) Release(ctx context.Context, l provider.Lease) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx, l.Holder, "release", l.Name); err != nil {
		return err
	}
	now := m.now()
	cur := m.leases[l.Name]
	if !cur.held(now) || cur.holder != l.Holder || cur.instance != l.Instance || cur.token != l.FencingToken {
		return nil
	}
	cur.expiresAt = now
	return nil
}

// ReleaseInstance implements [provider.InstanceReleaser]: it ends whatever
// term instance holds of the lease named name.
func (m *Memory) ReleaseInstance(ctx context.Context, name, holder, instance string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx, holder, "release", name); err != nil {
		return err
	}
	now := m.now()
	cur := m.leases[name]
	if cur.held(now) && cur.holder == holder && cur.instance == instance {
		cur.expiresAt = now
	}
	return nil
}

// Leader implements [provider.Provider]. It answers every caller, even a
// disconnected node, since the call does not say which node makes it.
func (m *Memory) Leader(ctx context.Context, name string) (*cluster.Leader, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("providertest: read lease %q: %w", name, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.leases[name]
	if !l.held(m.now()) {
		return nil, nil
	}
	return &cluster.Leader{NodeID: l.holder, Endpoint: l.endpoint, FencingToken: l.token, LeaseExpiresAt: l.expiresAt}, nil
}

// Expire ends the current term of the lease named name at once, as its
// holder crashing and the TTL then running out would, and keeps its
// fencing token: the next term gets a greater one. It does nothing when
// no term holds the lease.
//
// The holder is not told. A Cluster that holds the term finds out at its
// next renew, within [cluster.Config.HeartbeatInterval] of real time:
// Renew returns [cluster.ErrLeaseLost], and it reports a lease-lost event
// with [cluster.ReasonLeaseTaken] and campaigns again at once. Until then
// its IsLeader stays true, even if another node has acquired the lease
// meanwhile, which a real TTL (longer than FenceTimeout) would not allow;
// wait for the old holder's lease-lost event before asserting that only
// one node leads. A holder that is still connected may well win the
// lease back: to see another node take over, [Memory.Disconnect] the
// holder first, as a crash would.
func (m *Memory) Expire(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if l := m.leases[name]; l.held(now) {
		l.expiresAt = now
	}
}

// Disconnect cuts the node whose [cluster.Config.NodeID] is nodeID off
// from the store, as a crash or a network partition would: from now on its
// Acquire, Renew and Release calls fail with [ErrDisconnected] and change
// nothing (Leader calls do not say who makes them, so they still answer).
// Its lease is not released: it expires by the clock, or at once with
// [Memory.Expire].
//
// A Cluster that leads when it is cut off keeps retrying its renew, and
// stops believing it leads [cluster.Config.FenceTimeout] after the start
// of its last successful renew, by the real clock: it reports a lease-lost
// event with [cluster.ReasonSelfFenced]. Every process with that NodeID is
// cut off.
func (m *Memory) Disconnect(nodeID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.disconnected == nil {
		m.disconnected = map[string]bool{}
	}
	m.disconnected[nodeID] = true
}

// Reconnect undoes [Memory.Disconnect]: the node's next calls reach the
// store again.
func (m *Memory) Reconnect(nodeID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.disconnected, nodeID)
}
