package providertest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/provider"
)

// Memory keeps lanes ([provider.LaneStore]) and config versions
// ([provider.ConfigStore]) too, so that tests of partitioned work run
// without a database: [cluster.Cluster.ClaimLane] with [NoTx] (Memory
// has no transactions: a claim takes effect when it returns, as
// if its transaction had committed, and a rollback undoes nothing), and
// [Memory.ExpireLane] to end a claim as a crash would.

var (
	_ provider.LaneStore   = (*Memory)(nil)
	_ provider.Transactor  = (*Memory)(nil)
	_ provider.ConfigStore = (*Memory)(nil)
)

// laneID names a lane: its scope (the lease name) and key.
type laneID struct{ scope, key string }

// memLane is a lane's latest claim; kept after it ends, for the token.
type memLane struct {
	holder, instance           string
	token                      uint64
	acquired, renewed, expires time.Time // renewed: or released
}

func (l *memLane) held(now time.Time) bool { return l != nil && now.Before(l.expires) }

func (l *memLane) lane(key string, now time.Time) cluster.Lane {
	return cluster.Lane{Key: key, Holder: l.holder, Instance: l.instance, FencingToken: l.token,
		AcquiredAt: l.acquired, RenewedAt: l.renewed, ExpiresAt: l.expires, Remaining: l.expires.Sub(now)}
}

// laneState is what Memory keeps for lanes and config versions; the
// caller holds m.mu.
func (m *Memory) laneState() {
	if m.lanes == nil {
		m.lanes = map[laneID]*memLane{}
		m.takers = map[string]map[string]time.Time{}
		m.configs = map[string]uint64{}
		m.nodes = map[string]string{}
	}
}

// checkLane returns the error for a lane call by instance on ctx, if it
// must fail; node is the instance's NodeID when the call says it.
func (m *Memory) checkLane(ctx context.Context, node, instance, op, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("providertest: %s lane %q: %w", op, key, err)
	}
	m.laneState()
	if node == "" {
		node = m.nodes[instance]
	} else if instance != "" {
		m.nodes[instance] = node
	}
	if m.disconnected[node] {
		return fmt.Errorf("%w: node %q cannot %s lane %q", ErrDisconnected, node, op, key)
	}
	return nil
}

// census counts what a node's share of the lanes of scope is computed
// from, for instance, at now. The caller holds m.mu.
func (m *Memory) census(scope, instance string, window time.Duration, now time.Time) provider.LaneCensus {
	var c provider.LaneCensus
	since := now.Add(-window)
	for id, l := range m.lanes {
		if id.scope != scope {
			continue
		}
		if l.renewed.After(since) {
			c.Lanes++
		}
		if l.instance == instance && l.held(now) {
			c.Mine++
		}
	}
	me := m.nodes[instance]
	for other, seen := range m.takers[scope] {
		if other != instance && seen.After(since) {
			c.Members++
			load := provider.MemberLoad{Before: m.nodes[other] < me || (m.nodes[other] == me && other < instance)}
			for id, l := range m.lanes {
				if id.scope == scope && l.instance == other && l.held(now) {
					load.Lanes++
				}
			}
			c.Loads = append(c.Loads, load)
		}
	}
	return c
}

// InTx implements [provider.Transactor]: Memory's lane calls take effect
// at once and ignore their tx, so it calls f with a nil tx.
func (m *Memory) InTx(ctx context.Context, f func(tx provider.Querier) error) error {
	return f(nil)
}

// PeekLane implements [provider.LaneStore]; tx is ignored. A member counts
// in the census while it called JoinLanes or RenewLanes within window.
func (m *Memory) PeekLane(ctx context.Context, _ provider.Querier, req provider.LaneRequest, window time.Duration) (*cluster.Lane, provider.LaneCensus, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLane(ctx, req.Holder, req.Instance, "read", req.Key); err != nil {
		return nil, provider.LaneCensus{}, err
	}
	now := m.now()
	c := m.census(req.Scope, req.Instance, window, now)
	l := m.lanes[laneID{req.Scope, req.Key}]
	if l == nil {
		return nil, c, nil
	}
	out := l.lane(req.Key, now)
	return &out, c, nil
}

// ClaimLane implements [provider.LaneStore]: it claims the lane at once (tx
// is ignored), with the lane's next token when it is free or expired, or
// renews it, keeping its token, when req.Instance holds it; a lane another
// instance holds returns a [*cluster.LaneHeldError]. req.TTL must be
// positive.
func (m *Memory) ClaimLane(ctx context.Context, _ provider.Querier, req provider.LaneRequest) (cluster.Lane, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLane(ctx, req.Holder, req.Instance, "claim", req.Key); err != nil {
		return cluster.Lane{}, err
	}
	if req.TTL <= 0 {
		return cluster.Lane{}, fmt.Errorf("providertest: claim lane %q for %v: the TTL must be positive", req.Key, req.TTL)
	}
	now := m.now()
	id := laneID{req.Scope, req.Key}
	l := m.lanes[id]
	switch {
	case l.held(now) && l.instance != req.Instance:
		return cluster.Lane{}, &cluster.LaneHeldError{Lane: req.Key, Holder: l.holder, Instance: l.instance,
			FencingToken: l.token, ExpiresAt: l.expires, Remaining: l.expires.Sub(now)}
	case l == nil:
		l = &memLane{}
		m.lanes[id] = l
		fallthrough
	case !l.held(now):
		l.token++
		l.acquired = now
	}
	l.holder, l.instance = req.Holder, req.Instance
	l.renewed, l.expires = now, now.Add(req.TTL)
	return l.lane(req.Key, now), nil
}

// RenewLanes implements [provider.LaneStore]; it also counts the instance
// as seen, for the census, if it called JoinLanes.
func (m *Memory) RenewLanes(ctx context.Context, scope, instance string, ttl, window time.Duration) (provider.LaneReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLane(ctx, "", instance, "renew", "*"); err != nil {
		return provider.LaneReport{}, err
	}
	if ttl <= 0 {
		return provider.LaneReport{}, fmt.Errorf("providertest: renew lanes for %v: the TTL must be positive", ttl)
	}
	now := m.now()
	if _, ok := m.takers[scope][instance]; ok {
		m.takers[scope][instance] = now
	}
	var rep provider.LaneReport
	for id, l := range m.lanes {
		if id.scope == scope && l.instance == instance && l.held(now) {
			l.renewed, l.expires = now, now.Add(ttl)
			rep.Held = append(rep.Held, l.lane(id.key, now))
		}
	}
	slices.SortFunc(rep.Held, func(a, b cluster.Lane) int { return cmp.Compare(a.Key, b.Key) })
	rep.Census = m.census(scope, instance, window, now)
	rep.ConfigVersion, rep.HasConfigVersion = m.configs[scope]
	return rep, nil
}

// ReleaseLane implements [provider.LaneStore].
func (m *Memory) ReleaseLane(ctx context.Context, scope, key, holder, instance string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLane(ctx, holder, instance, "release", key); err != nil {
		return err
	}
	now := m.now()
	if l := m.lanes[laneID{scope, key}]; l.held(now) && l.holder == holder && l.instance == instance {
		l.renewed, l.expires = now, now
	}
	return nil
}

// ReleaseLanes implements [provider.LaneStore].
func (m *Memory) ReleaseLanes(ctx context.Context, scope, holder, instance string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLane(ctx, holder, instance, "release", "*"); err != nil {
		return err
	}
	now := m.now()
	for id, l := range m.lanes {
		if id.scope == scope && l.held(now) && l.holder == holder && l.instance == instance {
			l.renewed, l.expires = now, now
		}
	}
	return nil
}

// JoinLanes implements [provider.LaneStore]: the instance counts in the
// census of scope while it calls JoinLanes or RenewLanes within the
// census window.
func (m *Memory) JoinLanes(ctx context.Context, scope, instance string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLane(ctx, "", instance, "take", "*"); err != nil {
		return err
	}
	if m.takers[scope] == nil {
		m.takers[scope] = map[string]time.Time{}
	}
	m.takers[scope][instance] = m.now()
	return nil
}

// ReadLane implements [provider.LaneStore]. Like Leader, it answers every
// caller.
func (m *Memory) ReadLane(ctx context.Context, scope, key string) (*cluster.Lane, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("providertest: read lane %q: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.lanes[laneID{scope, key}]
	if l == nil {
		return nil, nil
	}
	out := l.lane(key, m.now())
	return &out, nil
}

// ExpireLane ends the current claim on lane key of scope (the lease name)
// at once, as its holder crashing and the TTL then running out would, and
// keeps its token: the next claim gets a greater one. It does nothing
// when the lane is not held. The holder is not told: its keeper finds out
// at its next renewal, within [cluster.Config.HeartbeatInterval], and
// emits lane-lost.
func (m *Memory) ExpireLane(scope, key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if l := m.lanes[laneID{scope, key}]; l.held(now) {
		l.renewed, l.expires = now, now
	}
}

// ReadConfigVersion implements [provider.ConfigStore].
func (m *Memory) ReadConfigVersion(ctx context.Context, scope string) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("providertest: read the config version: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.laneState()
	v, ok := m.configs[scope]
	if !ok {
		m.configs[scope] = 0
	}
	return v, nil
}

// BumpConfigVersion implements [provider.ConfigStore].
func (m *Memory) BumpConfigVersion(ctx context.Context, scope string) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("providertest: bump the config version: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.laneState()
	m.configs[scope]++
	return m.configs[scope], nil
}
