package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// Lanes: partitioned work. A lane is a key (a partition, a queue, a
// tenant) that one node at a time works on. Its row in <prefix>lanes
// names the node process that owns it until it expires by the database
// clock, under a fencing token of the lane's own: the token grows with
// every new claim and stays the same while the owner renews it.
//
//	claim (free or expired lane) --> owned, token+1
//	owned --ClaimLane or the keeper renews--> owned, same token
//	owned --ReleaseLane, Shutdown, over its share--> free at once, token kept
//	owned --owner dies or is cut off--> free when it expires, after LeaseTTL
//
// The keeper goroutine (started by the first lane claim or config-version
// call, see keep) renews every unexpired lane of this node once per
// heartbeat, refreshes the OwnsLane cache, and hands over the lanes above
// this node's share.

// maxLaneKeyLen is the longest lane key, in bytes.
const maxLaneKeyLen = 128

// laneState is a Cluster's lanes and its keeper.
type laneState struct {
	mu       sync.Mutex
	held     map[string]heldLane // this node's lanes, as far as it knows
	shedding map[string]bool     // lanes being handed over: released, or to be
	released map[string]int64    // lanes ReleaseLane released, and when its statement returned (monotonic)
	pending  int                 // new claims in flight
	stopped  bool                // Shutdown began: no claim, no keeper

	used atomic.Bool // a lane was claimed: the keeper renews lanes
	// duplicateLogged: a claim was refused to this process as a
	// duplicate NodeID, and logged at Warn (once).
	duplicateLogged atomic.Bool
	set             atomic.Pointer[laneSet] // what OwnsLane reads
	claims          workCount               // ClaimLane calls in flight, which Shutdown waits for
	work            workCount               // WorkLanes claims and work in flight, which Shutdown waits for
	// working cancels the WorkLanes work on a lane, by key; a nil value
	// reserves a key while WorkLanes claims it.
	working   map[string]context.CancelFunc
	census    provider.LaneCensus // the keeper's last census, for WorkLanes
	hasCensus bool
	cancel    context.CancelFunc // stops the keeper; nil until it starts
	kick      chan struct{}      // wakes the keeper at once
	wg        sync.WaitGroup     // the keeper goroutine
	joined    bool               // JoinLanes succeeded; keeper goroutine only
	joins     uint64             // Cluster.joins when it did; keeper goroutine only
	fails     int                // consecutive keeper failures; keeper goroutine only
}

// heldLane is one of this node's lanes.
type heldLane struct {
	token    uint64
	acquired int64 // unix ms by the database clock, for the order of hand-over
	until    int64 // monotonic end of this node's belief in it
	claimed  int64 // monotonic time ClaimLane granted it; 0 once the keeper saw it
}

// laneSet is an immutable snapshot of this node's lanes, sorted by key,
// for OwnsLane to search without locks or allocation.
type laneSet struct {
	keys  []string
	until []int64
}

// publishLanes makes held the snapshot OwnsLane reads. The caller holds
// c.lanes.mu.
func (c *Cluster) publishLanes() {
	s := &laneSet{keys: make([]string, 0, len(c.lanes.held))}
	for k := range c.lanes.held {
		s.keys = append(s.keys, k)
	}
	slices.Sort(s.keys)
	s.until = make([]int64, len(s.keys))
	for i, k := range s.keys {
		s.until[i] = c.lanes.held[k].until
	}
	c.lanes.set.Store(s)
}

// lanesHeld counts the lanes OwnsLane reports, without allocating.
func (c *Cluster) lanesHeld() int {
	s := c.lanes.set.Load()
	if s == nil {
		return 0
	}
	n, now := 0, mono()
	for _, u := range s.until {
		if now < u {
			n++
		}
	}
	return n
}

// laneEvent counts a lane event and emits it; a lane lost or released
// cancels the WorkLanes work on it. It never blocks. The caller holds
// c.lanes.mu, which keeps a lane's events in order.
func (c *Cluster) laneEvent(kind EventKind, key string, token uint64, reason Reason) {
	switch kind {
	case EventLaneAcquired:
		c.stats.laneAcquisitions.Add(1)
	case EventLaneLost:
		c.stats.laneLosses.Add(1)
	case EventLaneReleased:
		c.stats.laneReleases.Add(1)
	}
	if cancel := c.lanes.working[key]; cancel != nil && kind != EventLaneAcquired {
		cancel()
	}
	c.events.emit(Event{Kind: kind, NodeID: c.cfg.NodeID, At: time.Now(), FencingToken: token, Reason: reason, Lane: key})
}

// laneUntil is the end of this node's belief in a lane that had remaining
// left, by the database clock, at a statement that started at start: the
// same margin as the trust window's, LeaseTTL - FenceTimeout, before the
// database can expire it.
func (c *Cluster) laneUntil(start int64, remaining time.Duration) int64 {
	return monoAfter(start, remaining-(c.cfg.LeaseTTL-c.cfg.FenceTimeout))
}

// OwnsLane reports whether this node believes it owns lane key: it claimed
// it, or its keeper renewed it, and its belief has not ended (on the
// monotonic clock, the same margin before the lane can expire as the
// trust window has before the lease can). It does no I/O, takes no lock
// and does not allocate, so a worker may call it for every item to skip
// the keys it does not own.
//
// OwnsLane is a hint: the claim is the authority. A claim whose
// transaction rolled back still shows as owned for up to two heartbeats,
// and a node that lost a lane learns it at the keeper's next refresh or
// its next claim. Write only in a transaction that begins with
// [Cluster.ClaimLane]. In single-node mode (the package-level OwnsLane
// before Init) every lane is owned.
func (c *Cluster) OwnsLane(key string) bool {
	if c.isDefault() {
		return stdOwnsLane(key)
	}
	s := c.lanes.set.Load()
	if s == nil {
		return false
	}
	lo, hi := 0, len(s.keys)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.keys[m] < key {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo < len(s.keys) && s.keys[lo] == key && mono() < s.until[lo]
}

// Lanes returns the keys of the lanes this node believes it owns, sorted,
// for reporting; see [Cluster.OwnsLane].
func (c *Cluster) Lanes() []string {
	if c.isDefault() {
		return stdLanes()
	}
	s := c.lanes.set.Load()
	if s == nil {
		return nil
	}
	now := mono()
	var out []string
	for i, k := range s.keys {
		if now < s.until[i] {
			out = append(out, k)
		}
	}
	return out
}

// LaneOwner reads who holds lane key now, by the database clock: the
// lane's row, with its holder's NodeID and process instance, its fencing
// token and its expiry (Remaining is what was left of the claim when it
// was read). It returns nil and no error when no node holds the lane:
// never claimed, released, or expired. It reads on a connection of its
// own and locks nothing, so the answer may be stale by the time it
// returns; it is for reporting and routing (send a key's work to the node
// that holds it), not for fencing, which is [Cluster.ClaimLane]'s.
// Unlike [Cluster.OwnsLane] it does I/O, and it answers for any node.
func (c *Cluster) LaneOwner(ctx context.Context, key string) (*Lane, error) {
	if c.isDefault() {
		return stdLaneOwner(ctx, key)
	}
	store, ok := c.provider.(provider.LaneStore)
	if !ok {
		return nil, c.errNoCapability("LaneOwner", "LaneStore")
	}
	if err := checkLaneKey(key); err != nil {
		return nil, err
	}
	if c.down.Load() {
		return nil, c.errDown
	}
	l, err := store.ReadLane(ctx, c.cfg.LeaseName, key)
	if err != nil {
		return nil, fmt.Errorf("cluster: read the owner of lane %q: %w", key, err)
	}
	if l == nil || l.Remaining <= 0 || l.FencingToken == 0 {
		return nil, nil
	}
	return l, nil
}

// ClaimLane claims lane key for this node inside the caller's transaction
// tx, which is the authority, and returns the lane's fencing token: it
// leases the lane to this node if it is free or expired (a new claim: the
// token grows), or renews it if this node holds it already (the token stays
// the same). The claim holds until tx ends: the lane row stays locked
// (PostgreSQL, MySQL) or the database's write lock held (SQLite), so no
// other node can claim the lane and commit before tx does. Every write
// committed under a lane token T therefore commits before any claim of a
// token above T.
//
// ClaimLane is the fence of a lane: a worker calls it first in every
// transaction that processes the lane's items, before it reads the next
// item, and stores the token with what it writes. A node that lost the
// lane (it expired while the node was paused or cut off, and another took
// it) is refused in its next transaction. Work done outside the
// transaction under an earlier token (a call made between two
// transactions) is stale when ClaimLane returns another token: the lane
// changed hands meanwhile.
//
// A lane another node holds returns an error matching [ErrLaneHeld]
// (a [*LaneHeldError]); a claim that would take this node past its share
// of the lanes, or past [Config.MaxLanes], returns one matching
// [ErrLaneLimit]. Either way the lane is another node's to work on: move
// on to another key, and roll tx back. After Shutdown it returns an error
// matching [ErrShutdown] and [ErrStaleFencingToken].
//
// A claim that begins a new claim (not a renewal) emits lane-acquired; a
// refusal of a lane this node believed it owned emits lane-lost (see
// [EventLaneAcquired]).
//
// Share: a node may hold ⌊lanes / members⌋ lanes, one more if it is
// among the first lanes mod members of the members by NodeID, so the
// lanes spread to within one of even (4 over 3 nodes: 2/1/1). lanes
// counts the lanes of this cluster (this LeaseName) held by any node
// within the last LeaseTTL plus a heartbeat (claimed, renewed or released
// that recently), the lane claimed included, and members counts the
// members that take lanes (that called ClaimLane) seen within that
// window, this node included. The keeper hands over the lanes above the
// share, the most recently claimed first, at its next heartbeat; see
// "Partitioned work" in docs/usage.md.
//
// Cost: one statement in tx to renew a lane this node holds (two on
// MySQL, which reads the row back; MariaDB also sets the session's idle
// timeout, as Fence does); a new claim first reads the lane and the census
// (one statement more), and the first claim of a lane by this process
// first creates its row if it is absent (one more: on MySQL, two nodes
// that both inserted a missing row after looking for it would deadlock).
// Like Fence, it bounds on the server the wait for the lane row and
// how long tx may then sit idle by LeaseTTL, so keep lane transactions
// short. On SQLite, open the database with _txlock=immediate.
func (c *Cluster) ClaimLane(ctx context.Context, tx Tx, key string) (uint64, error) {
	if c.isDefault() {
		return stdClaimLane(ctx, tx, key)
	}
	q, err := querierOf("ClaimLane", tx)
	if err != nil {
		return 0, err
	}
	return c.claimLane(ctx, q, key)
}

// claimLane is ClaimLane in q, a transaction of the caller's or, for
// WorkLanes, of the provider's.
func (c *Cluster) claimLane(ctx context.Context, q provider.Querier, key string) (uint64, error) {
	store, ok := c.provider.(provider.LaneStore)
	if !ok {
		return 0, c.errNoCapability("ClaimLane", "LaneStore")
	}
	if err := checkLaneKey(key); err != nil {
		return 0, err
	}
	if c.down.Load() || !c.enterClaim() {
		return 0, c.errDownFence
	}
	defer c.lanes.claims.done()
	req := provider.LaneRequest{Scope: c.cfg.LeaseName, Key: key, Holder: c.cfg.NodeID, Instance: c.instance, TTL: c.cfg.LeaseTTL}

	c.lanes.mu.Lock()
	_, held := c.lanes.held[key]
	shedding := c.lanes.shedding[key]
	c.lanes.mu.Unlock()
	if shedding {
		return 0, fmt.Errorf("%w: node %q is handing lane %q over: it holds more than its share", ErrLaneLimit, c.cfg.NodeID, key)
	}
	opStart := mono()
	reserved := false
	if !held {
		window := c.laneWindow()
		l, census, err := store.PeekLane(ctx, q, req, window)
		if err != nil {
			c.record(OpClaimLane, opStart, err)
			return 0, err
		}
		if census.Elders == 0 && !c.lanes.used.Swap(true) {
			// Renews from now on, and records that this node takes lanes,
			// so that it counts in the fair share even when this claim is
			// refused; a duplicate NodeID (below) never counts.
			c.startKeeper()
		}
		switch {
		case l != nil && l.Remaining > 0 && l.Instance == c.instance:
			// Ours already: claimed since the keeper's last refresh.
		case l != nil && l.Remaining > 0:
			err := &LaneHeldError{Lane: key, Holder: l.Holder, Instance: l.Instance, FencingToken: l.FencingToken,
				ExpiresAt: l.ExpiresAt, Remaining: l.Remaining}
			c.record(OpClaimLane, opStart, err)
			return 0, err
		case census.Elders > 0:
			// Another process runs with this NodeID and started first: as
			// for the lease, the duplicate waits rather than work beside it.
			err := fmt.Errorf("%w: node %q: %d live process(es) with the same NodeID started before this one (instance %s); it claims no lane while they run: give each process its own NodeID",
				ErrDuplicateNodeID, c.cfg.NodeID, census.Elders, c.instance)
			if c.lanes.duplicateLogged.CompareAndSwap(false, true) {
				c.log.WarnContext(ctx, "cluster: a duplicate NodeID is refused lanes while the process that has it first runs", "err", err)
			}
			c.record(OpClaimLane, opStart, err)
			return 0, err
		default:
			counted := l != nil && l.RenewedAt.After(l.ExpiresAt.Add(-l.Remaining-window))
			if err := c.reserveLane(key, census, counted); err != nil {
				c.record(OpClaimLane, opStart, err)
				return 0, err
			}
			reserved = true
		}
	}

	start := mono()
	l, err := store.ClaimLane(ctx, q, req)
	c.record(OpClaimLane, opStart, err)
	var heldErr *LaneHeldError
	c.lanes.mu.Lock()
	if reserved {
		c.lanes.pending--
	}
	switch {
	case err == nil && !c.lanes.stopped:
		if h, ok := c.lanes.held[key]; !ok || h.token != l.FencingToken {
			if ok {
				c.laneEvent(EventLaneLost, key, h.token, ReasonLaneTaken)
			}
			if c.lanes.held == nil {
				c.lanes.held = map[string]heldLane{}
			}
			c.lanes.held[key] = heldLane{token: l.FencingToken, acquired: l.AcquiredAt.UnixMilli(),
				until: c.laneUntil(start, l.Remaining), claimed: start}
			c.publishLanes()
			c.laneEvent(EventLaneAcquired, key, l.FencingToken, "")
		}
	case errors.As(err, &heldErr):
		if h, ok := c.lanes.held[key]; ok {
			delete(c.lanes.held, key)
			c.publishLanes()
			c.laneEvent(EventLaneLost, key, h.token, ReasonLaneTaken)
		}
	}
	c.lanes.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return l.FencingToken, nil
}

// checkLaneKey validates a lane key as the lease name is validated.
func checkLaneKey(key string) error {
	if key == "" {
		return configErrorf("a lane key must not be empty")
	}
	return checkText("lane key", key, maxLaneKeyLen)
}

// enterClaim counts a ClaimLane call in, unless Shutdown began.
func (c *Cluster) enterClaim() bool {
	c.lanes.mu.Lock()
	defer c.lanes.mu.Unlock()
	if c.lanes.stopped {
		return false
	}
	c.lanes.claims.add()
	return true
}

// laneWindow is how recently a lane must have been held, and a member
// that takes lanes seen, to count in the fair share: a lane TTL and a
// heartbeat. A node that takes lanes is seen every heartbeat (see
// refreshLanes), so a crashed one stops counting about when its lanes
// expire, and the others can take them.
func (c *Cluster) laneWindow() time.Duration {
	return c.cfg.LeaseTTL + c.cfg.HeartbeatInterval
}

// laneLimit is how many lanes this node may hold given census: for a new
// claim (keep false: census.Lanes counts the lane claimed when counted),
// or for the lanes it holds (keep true: the keeper hands over the rest).
//
// Within one of even: with base = lanes / members and extra = lanes %
// members, every member may hold base lanes, and extra of them one more.
// A claim takes one more while fewer than extra other members hold more
// than base; a member keeps one more while fewer than extra of the others
// that hold more than base sort before it (by NodeID, then instance), so
// two that both took one more settle with the one that sorts first
// keeping it: 4 lanes over 3 members settle 2/1/1, never 2/2/0. A store
// that reports no loads gets ⌈lanes / members⌉.
func (c *Cluster) laneLimit(census provider.LaneCensus, counted, keep bool) (limit int, rule string) {
	lanes := census.Lanes
	if !counted {
		lanes++
	}
	members := census.Members + 1
	base, extra := lanes/members, lanes%members
	switch {
	case extra == 0:
		limit = base
	case census.Members > 0 && len(census.Loads) == 0:
		limit = base + 1
	default:
		above := 0
		for _, l := range census.Loads {
			if l.Lanes > base && (l.Before || !keep) {
				above++
			}
		}
		limit = base
		if above < extra {
			limit++
		}
	}
	rule = fmt.Sprintf("its fair share of %d lanes among %d members", lanes, members)
	if m := c.cfg.MaxLanes; m > 0 && m <= limit {
		limit, rule = m, "Config.MaxLanes"
	}
	return limit, rule
}

// reserveLane admits a new claim of key within this node's limit, counting
// the claims in flight; the caller undoes the reservation when the claim
// returns.
func (c *Cluster) reserveLane(key string, census provider.LaneCensus, counted bool) error {
	limit, rule := c.laneLimit(census, counted, false)
	c.lanes.mu.Lock()
	defer c.lanes.mu.Unlock()
	if mine := max(census.Mine, len(c.lanes.held)) + c.lanes.pending; mine >= limit {
		return fmt.Errorf("%w: node %q holds %d lanes, %s (%d), so lane %q is another node's to take",
			ErrLaneLimit, c.cfg.NodeID, mine, rule, limit, key)
	}
	c.lanes.pending++
	return nil
}

// ReleaseLane ends this node's claim on lane key at once, keeping its
// token, so another node can claim it without waiting for it to expire;
// OwnsLane turns false first. It runs on a connection of its own: call it
// outside the lane's transactions (on PostgreSQL and MySQL it waits for
// an open one to end; on SQLite a transaction of this goroutine would
// block it). ClaimLane may take the lane again: stop claiming it first.
// Releasing a lane this node does not hold is not an error. Releasing one
// it holds emits lane-released (ReasonReleased, or ReasonReleaseFailed
// when the statement failed and the lane expires after LeaseTTL).
func (c *Cluster) ReleaseLane(ctx context.Context, key string) error {
	if c.isDefault() {
		return stdReleaseLane(ctx, key)
	}
	store, ok := c.provider.(provider.LaneStore)
	if !ok {
		return c.errNoCapability("ReleaseLane", "LaneStore")
	}
	if c.down.Load() {
		return c.errDown
	}
	c.lanes.mu.Lock()
	if c.lanes.released == nil {
		c.lanes.released = map[string]int64{}
	}
	// A keeper refresh that starts before the release returns may still
	// report the lane as ours: it must not put it back.
	c.lanes.released[key] = math.MaxInt64
	h, had := c.lanes.held[key]
	if had {
		delete(c.lanes.held, key)
		c.publishLanes()
	}
	c.lanes.mu.Unlock()
	start := mono()
	err := store.ReleaseLane(ctx, c.cfg.LeaseName, key, c.cfg.NodeID, c.instance)
	c.record(OpReleaseLane, start, err)
	c.lanes.mu.Lock()
	if c.lanes.released != nil {
		c.lanes.released[key] = mono()
	}
	if had {
		c.laneEvent(EventLaneReleased, key, h.token, releaseReason(ReasonReleased, err))
	}
	c.lanes.mu.Unlock()
	return err
}

// releaseReason is why a lane was released: why, or ReasonReleaseFailed
// when the release failed.
func releaseReason(why Reason, err error) Reason {
	if err != nil {
		return ReasonReleaseFailed
	}
	return why
}

// startKeeper starts the keeper goroutine, or wakes it, unless Shutdown
// began.
func (c *Cluster) startKeeper() {
	c.lanes.mu.Lock()
	defer c.lanes.mu.Unlock()
	if c.lanes.stopped {
		return
	}
	if c.lanes.cancel != nil {
		select {
		case c.lanes.kick <- struct{}{}:
		default:
		}
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.lanes.cancel = cancel
	c.lanes.kick = make(chan struct{}, 1)
	c.lanes.wg.Add(1)
	go c.keep(ctx, c.lanes.kick)
}

// keep is the keeper goroutine: once per heartbeat it renews this node's
// lanes, reading the config version in the same statements, or reads the
// config version alone while no lane was claimed. It runs on its own
// goroutine so that a lane row held by a long transaction never delays
// the lease's heartbeat.
func (c *Cluster) keep(ctx context.Context, kick <-chan struct{}) {
	defer c.lanes.wg.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-kick:
		}
		start := mono()
		covered := false
		if store, ok := c.provider.(provider.LaneStore); ok && c.lanes.used.Load() {
			covered = c.refreshLanes(ctx, store)
		}
		if !covered && c.conf.watching.Load() {
			c.refreshConfig(ctx)
		}
		timer.Reset(max(c.cfg.HeartbeatInterval-time.Duration(mono()-start), 0))
	}
}

// keeperTimeout bounds a keeper statement: it may wait for its turn (a
// row or SQLite's write lock held by a transaction) as long as this
// node's belief in the lanes it renews can outlast a heartbeat, and the
// next attempt then starts at once.
func (c *Cluster) keeperTimeout() time.Duration {
	return max(c.cfg.HeartbeatInterval, c.cfg.FenceTimeout-c.cfg.HeartbeatInterval)
}

// keeperResult logs the outcome of a keeper statement: the first failure
// of a streak at Warn, the rest at Debug, the recovery at Info.
func (c *Cluster) keeperResult(ctx context.Context, what string, err error) {
	switch {
	case err == nil && c.lanes.fails > 0:
		c.log.InfoContext(ctx, "cluster: "+what+" succeeded after failures", "failures", c.lanes.fails)
		c.lanes.fails = 0
	case err == nil:
	case ctx.Err() != nil:
	case c.lanes.fails == 0:
		c.lanes.fails++
		c.log.WarnContext(ctx, "cluster: "+what+" failed; this node's lanes expire after LeaseTTL unless a later heartbeat renews them", "err", err)
	default:
		c.lanes.fails++
		c.log.DebugContext(ctx, "cluster: "+what+" failed again", "failures", c.lanes.fails, "err", err)
	}
}

// refreshLanes is one heartbeat of this node's lanes: it renews them,
// refreshes what OwnsLane reads, and hands over the lanes above this
// node's share. It reports whether it also read the config version.
func (c *Cluster) refreshLanes(ctx context.Context, store provider.LaneStore) bool {
	if c.members != nil && c.mustJoin.Load() {
		// The fair share counts members: a node whose membership row is
		// missing (its join at Init failed, or the row was taken over)
		// would never get a lane while the others hold them. Join again,
		// at the keeper's pace, as the heartbeat does at its own.
		c.joinNow(ctx, c.keeperTimeout())
	}
	// A membership row joined again (its old one taken over: here or on
	// the heartbeat goroutine) does not take lanes yet.
	joins := c.joins.Load()
	if (!c.lanes.joined || c.lanes.joins != joins) && (c.members == nil || c.member()) {
		jctx, cancel := context.WithTimeout(ctx, c.keeperTimeout())
		if err := store.JoinLanes(jctx, c.cfg.LeaseName, c.instance); err == nil {
			c.lanes.joined, c.lanes.joins = true, joins
		} else if ctx.Err() == nil {
			c.log.DebugContext(ctx, "cluster: could not record that this node takes lanes; it is not counted in their fair share yet", "err", err)
		}
		cancel()
	}
	if c.members != nil && c.member() && !c.members.SeenByLease() {
		// Where the lease statements do not refresh membership, the keeper
		// does, every heartbeat: the fair share counts a member as live
		// only while it was seen within the lane window.
		sctx, cancel := context.WithTimeout(ctx, c.keeperTimeout())
		err := c.members.Seen(sctx, c.cfg.LeaseName, c.instance)
		switch {
		case errors.Is(err, provider.ErrNotMember):
			// The next keeper heartbeat joins again, and then the lanes.
			c.rowTakenOver(ctx, err)
		case err != nil && ctx.Err() == nil:
			c.log.DebugContext(ctx, "cluster: membership refresh for lanes failed", "err", err)
		}
		cancel()
	}
	start := mono()
	rctx, cancel := context.WithTimeout(ctx, c.keeperTimeout())
	rep, err := store.RenewLanes(rctx, c.cfg.LeaseName, c.instance, c.cfg.LeaseTTL, c.laneWindow())
	cancel()
	if ctx.Err() == nil {
		c.record(OpRenewLanes, start, err)
	}
	c.keeperResult(ctx, "renew lanes", err)
	if err != nil {
		if ctx.Err() == nil {
			c.fenceLanes()
		}
		return false
	}

	c.lanes.mu.Lock()
	if c.lanes.shedding == nil {
		c.lanes.shedding = map[string]bool{}
	}
	ours := make(map[string]bool, len(rep.Held))
	next := make(map[string]heldLane, len(rep.Held))
	for k, at := range c.lanes.released {
		if at < start {
			delete(c.lanes.released, k) // this refresh began after the release
		}
	}
	for _, l := range rep.Held {
		ours[l.Key] = true
		if _, ok := c.lanes.released[l.Key]; !ok && !c.lanes.shedding[l.Key] {
			next[l.Key] = heldLane{token: l.FencingToken, acquired: l.AcquiredAt.UnixMilli(), until: c.laneUntil(start, l.Remaining)}
		}
	}
	census := rep.Census
	for k, h := range c.lanes.held {
		// Claimed within a heartbeat of this refresh: its transaction may
		// not have committed in time for the statement to see it, nor to
		// count it. (One that rolled back stays until the next refresh, or
		// until its belief ends.)
		if _, ok := next[k]; !ok && h.claimed >= monoAfter(start, -c.cfg.HeartbeatInterval) {
			next[k] = h
			census.Lanes++
		}
	}
	for k := range c.lanes.shedding {
		if !ours[k] {
			delete(c.lanes.shedding, k) // released, or expired
		}
	}
	census.Mine = len(next)
	c.lanes.census, c.lanes.hasCensus = census, true
	limit, rule := c.laneLimit(census, true, true)
	if extra := len(next) - limit; extra > 0 {
		keys := make([]string, 0, len(next))
		for k := range next {
			keys = append(keys, k)
		}
		// The most recently claimed first, then the greatest key.
		slices.SortFunc(keys, func(a, b string) int {
			return cmp.Or(cmp.Compare(next[b].acquired, next[a].acquired), cmp.Compare(b, a))
		})
		for _, k := range keys[:extra] {
			delete(next, k)
			c.lanes.shedding[k] = true
		}
		c.log.InfoContext(ctx, "cluster: handing over lanes above this node's share", "lanes", keys[:extra], "limit", limit, "rule", rule)
	}
	for k, h := range c.lanes.held {
		n, ok := next[k]
		switch {
		case !ok && c.lanes.shedding[k]:
			c.laneEvent(EventLaneReleased, k, h.token, ReasonHandedOver)
		case !ok:
			c.laneEvent(EventLaneLost, k, h.token, ReasonLaneTaken)
		case n.token != h.token:
			c.laneEvent(EventLaneLost, k, h.token, ReasonLaneTaken)
			c.laneEvent(EventLaneAcquired, k, n.token, "")
		}
	}
	for k, n := range next {
		if _, ok := c.lanes.held[k]; !ok {
			c.laneEvent(EventLaneAcquired, k, n.token, "")
		}
	}
	c.lanes.held = next
	release := make([]string, 0, len(c.lanes.shedding))
	for k := range c.lanes.shedding {
		if c.lanes.working[k] != nil {
			continue // its work was cancelled; WorkLanes releases it once the work returns
		}
		release = append(release, k)
	}
	c.publishLanes()
	c.lanes.mu.Unlock()

	for _, k := range release {
		rctx, cancel := context.WithTimeout(ctx, c.keeperTimeout())
		start := mono()
		err := store.ReleaseLane(rctx, c.cfg.LeaseName, k, c.cfg.NodeID, c.instance)
		cancel()
		if ctx.Err() == nil {
			c.record(OpReleaseLane, start, err)
		}
		if err != nil {
			c.log.DebugContext(ctx, "cluster: handing over a lane failed; trying again at the next heartbeat", "lane", k, "err", err)
			continue
		}
		c.lanes.mu.Lock()
		delete(c.lanes.shedding, k)
		c.lanes.mu.Unlock()
	}
	if rep.HasConfigVersion && c.conf.watching.Load() {
		c.observeConfig(rep.ConfigVersion)
	}
	return rep.HasConfigVersion
}

// fenceLanes forgets, after a failed renewal, the lanes whose belief
// ended (OwnsLane already reports them as not owned), so that this node
// tells its handlers it lost them before they can expire.
func (c *Cluster) fenceLanes() {
	c.lanes.mu.Lock()
	defer c.lanes.mu.Unlock()
	now, changed := mono(), false
	for k, h := range c.lanes.held {
		if now >= h.until {
			delete(c.lanes.held, k)
			changed = true
			c.laneEvent(EventLaneLost, k, h.token, ReasonSelfFenced)
		}
	}
	if changed {
		c.publishLanes()
	}
}

// stopKeeper is Shutdown's part for lanes, after leader work stopped: no
// claim starts from now on, the keeper stops, the claims in flight return
// (within ctx), OwnsLane turns false, and this node's lanes are released
// at once, bounded by a heartbeat on a context the caller cannot cancel.
// Transactions still open on a lane hold its row: the release waits for
// them on PostgreSQL and MySQL.
func (c *Cluster) stopKeeper(ctx context.Context) {
	// WorkLanes saw Shutdown begin and cancelled its work; the lanes stay
	// this node's, renewed, until the work returns.
	if n, err := c.lanes.work.wait(ctx); err != nil {
		c.log.WarnContext(ctx, "cluster: lane work still running at the Shutdown deadline; releasing the lanes anyway", "running", n, "err", err)
	}
	c.lanes.mu.Lock()
	c.lanes.stopped = true
	cancel := c.lanes.cancel
	c.lanes.mu.Unlock()
	if cancel != nil {
		cancel()
		c.lanes.wg.Wait()
	}
	if n, err := c.lanes.claims.wait(ctx); err != nil {
		c.log.WarnContext(ctx, "cluster: lane claims still running at the Shutdown deadline; releasing the lanes anyway", "running", n, "err", err)
	}
	c.lanes.mu.Lock()
	held := c.lanes.held
	c.lanes.held, c.lanes.shedding, c.lanes.released = nil, nil, nil
	c.publishLanes()
	c.lanes.mu.Unlock()
	store, ok := c.provider.(provider.LaneStore)
	if !ok || !c.lanes.used.Load() {
		return
	}
	rctx, cancelRelease := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HeartbeatInterval)
	defer cancelRelease()
	start := mono()
	err := store.ReleaseLanes(rctx, c.cfg.LeaseName, c.cfg.NodeID, c.instance)
	c.record(OpReleaseLane, start, err)
	keys := make([]string, 0, len(held))
	for k := range held {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	c.lanes.mu.Lock()
	for _, k := range keys {
		c.laneEvent(EventLaneReleased, k, held[k].token, releaseReason(ReasonShutdown, err))
	}
	c.lanes.mu.Unlock()
	if err != nil {
		c.log.WarnContext(ctx, "cluster: releasing this node's lanes on shutdown failed; they expire after LeaseTTL", "err", err)
		return
	}
	c.log.InfoContext(ctx, "cluster: lanes released")
}
