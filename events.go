package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// EventKind names a transition of this node's leadership or of its lanes,
// or a change it observed.
type EventKind string

// The transitions a node reports.
const (
	// EventLeaseAcquired: this node acquired the lease and leads with the
	// event's FencingToken.
	EventLeaseAcquired EventKind = "lease-acquired"
	// EventLeaseLost: this node stopped leading without releasing. Reason
	// says why: ReasonSelfFenced or ReasonLeaseTaken.
	EventLeaseLost EventKind = "lease-lost"
	// EventLeaseReleased: this node released the lease, in
	// [Cluster.Shutdown] (ReasonShutdown, or ReasonReleaseFailed when the
	// release failed and the lease will expire by itself) or in
	// [Cluster.Resign] (ReasonResigned).
	EventLeaseReleased EventKind = "lease-released"
	// EventLeaderChanged: this node learnt of a new term, its own or
	// another node's, or that the lease became free. LeaderID,
	// LeaderEndpoint and FencingToken describe the new term; a free lease
	// has an empty LeaderID and the token of the term that ended. Every
	// node emits it, followers included: candidates learn from the
	// attempts they already make, at most 1.2 heartbeats late; nodes
	// with [RoleFollower] read the lease about once per heartbeat.
	EventLeaderChanged EventKind = "leader-changed"
	// EventRollbackDetected: this node found the database rolled back (see
	// [ErrRollbackDetected]); it released the lease if it held it and
	// stopped campaigning. Err holds the details.
	EventRollbackDetected EventKind = "rollback-detected"
	// EventVaultKeyRotated: this node advanced the cluster's vault-key
	// fingerprint under [Config.AcceptVaultKeyRotation]. Detail holds the
	// fingerprint prefixes and the new rotation epoch.
	EventVaultKeyRotated EventKind = "vault-key-rotated"
	// EventConfigVersionChanged: this node saw the cluster's config version
	// grow (see [Cluster.ConfigVersion]), to the event's ConfigVersion,
	// through another node's [Cluster.BumpConfigVersion]. A node's own bump
	// emits nothing on that node.
	EventConfigVersionChanged EventKind = "config-version-changed"
	// EventLaneAcquired: this node began a claim on the event's Lane, with
	// the lane's FencingToken: [Cluster.ClaimLane] granted it a lane that
	// was free or expired, or the keeper found it holds one it did not
	// know of. It is emitted when the claim returns, before the caller's
	// transaction commits: if that rolls back, lane-lost follows within
	// about a heartbeat. Renewals emit nothing.
	EventLaneAcquired EventKind = "lane-acquired"
	// EventLaneLost: this node stopped owning the event's Lane without
	// releasing it. Reason says why: ReasonLaneTaken (a claim or the
	// keeper found the lane is no longer this node's: it expired, was
	// released by an operator, or another node claimed it) or
	// ReasonSelfFenced (the keeper could not renew it in time, so OwnsLane
	// turned false before the lane could expire; if the lane turns out to
	// be still this node's when the database answers again, lane-acquired
	// follows, with the same token). Work on the lane must stop.
	EventLaneLost EventKind = "lane-lost"
	// EventLaneReleased: this node released the event's Lane: in
	// [Cluster.ReleaseLane] (ReasonReleased), above its share of the lanes
	// (ReasonHandedOver) or in [Cluster.Shutdown] (ReasonShutdown); with
	// ReasonReleaseFailed when the release failed and the lane expires
	// after LeaseTTL.
	EventLaneReleased EventKind = "lane-released"
)

// A Reason says why a term ended.
type Reason string

// Reasons carried by [Event.Reason].
const (
	// ReasonSelfFenced: no renew succeeded within [Config.FenceTimeout], so
	// the node stopped believing it leads before its lease could expire.
	ReasonSelfFenced Reason = "self-fenced"
	// ReasonLeaseTaken: a renew found that the lease no longer belongs to
	// this node's term (it expired and another node, or another process
	// with the same NodeID, acquired it).
	ReasonLeaseTaken Reason = "lease-taken"
	// ReasonShutdown: the node released the lease in Shutdown.
	ReasonShutdown Reason = "shutdown"
	// ReasonReleaseFailed: Shutdown or Resign could not release the lease;
	// it expires after LeaseTTL.
	ReasonReleaseFailed Reason = "release-failed"
	// ReasonResigned: the node released the lease in Resign.
	ReasonResigned Reason = "resigned"
	// ReasonLaneTaken: the lane is no longer this node's claim: it
	// expired, an operator released it, or another node claimed it.
	ReasonLaneTaken Reason = "lane-taken"
	// ReasonReleased: the node released the lane in ReleaseLane.
	ReasonReleased Reason = "released"
	// ReasonHandedOver: the node held more lanes than its share and
	// released this one for another node to claim.
	ReasonHandedOver Reason = "handed-over"
)

// An Event reports a leadership transition of this node, or a change of
// leader it observed.
type Event struct {
	Kind         EventKind
	NodeID       string    // this node
	At           time.Time // local wall-clock time of the transition
	FencingToken uint64    // token of the term acquired, lost, released or observed; a lane event's lane token
	Reason       Reason    // why a term or a claim ended: lease-lost, lease-released, lane-lost, lane-released
	// LeaderID and LeaderEndpoint name the new leader in a leader-changed
	// event; LeaderID is empty when the lease became free.
	LeaderID       string
	LeaderEndpoint string
	// Detail is free text for people (vault-key-rotated); do not parse it.
	Detail string
	// Err is the error behind a rollback-detected event.
	Err error
	// ConfigVersion is the new version in a config-version-changed event.
	ConfigVersion uint64
	// Lane is the lane key of a lane-acquired, lane-lost or lane-released
	// event.
	Lane string
}

// dispatcher delivers events to handlers in order on its own goroutine, so
// a slow handler never delays a renew. The queue is unbounded; events are
// rare (a few per term).
type dispatcher struct {
	log     *slog.Logger
	gid     atomic.Uint64 // the goroutine's id, see current
	calling atomic.Bool   // a handler runs on the goroutine now

	mu       sync.Mutex
	handlers []func(Event)
	queue    []queued
	closed   bool
	wake     chan struct{}
	done     chan struct{}
}

func newDispatcher(log *slog.Logger) *dispatcher {
	d := &dispatcher{log: log, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go d.run()
	return d
}

func (d *dispatcher) subscribe(f func(Event)) {
	if f == nil {
		return
	}
	d.mu.Lock()
	d.handlers = append(d.handlers, f)
	d.mu.Unlock()
}

// queued is an event and the number of handlers registered when it was
// emitted: a handler registered later does not receive it.
type queued struct {
	e        Event
	handlers int
}

// emit queues e for the handlers registered now. It never blocks. Events
// emitted after close are dropped.
func (d *dispatcher) emit(e Event) {
	d.mu.Lock()
	if !d.closed {
		d.queue = append(d.queue, queued{e, len(d.handlers)})
	}
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// close stops accepting events; the goroutine exits once the queue drains.
func (d *dispatcher) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// wait blocks until the goroutine has delivered every queued event and
// exited, or ctx is done.
func (d *dispatcher) wait(ctx context.Context) error {
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// current reports whether it is called on the dispatcher's goroutine, that
// is, from a handler. While no handler runs it cannot be (the goroutine
// runs no other code of the caller's), and it answers at once; otherwise
// it parses a stack header (about 0.1 ms, measured on Shutdown's path,
// which the followers wait for), so it is for Shutdown's path only, never
// a hot one.
func (d *dispatcher) current() bool {
	if !d.calling.Load() {
		return false
	}
	id := goroutineID()
	return id != 0 && id == d.gid.Load()
}

// goroutineID returns the id of the calling goroutine, read from the
// "goroutine N [" header of its stack, or 0 if the header cannot be read.
// Go offers no other way; the id is only ever compared for equality.
func goroutineID() uint64 {
	var buf [64]byte
	b, ok := bytes.CutPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	if !ok {
		return 0
	}
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		b = b[:i]
	}
	id, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0
	}
	return id
}

func (d *dispatcher) run() {
	// Recorded before any handler runs, so a handler that asks always
	// finds it.
	d.gid.Store(goroutineID())
	defer close(d.done)
	for {
		d.mu.Lock()
		if len(d.queue) == 0 {
			closed := d.closed
			d.mu.Unlock()
			if closed {
				return
			}
			<-d.wake
			continue
		}
		q := d.queue[0]
		d.queue[0] = queued{}
		d.queue = d.queue[1:]
		e := q.e
		handlers := d.handlers[:q.handlers:q.handlers]
		d.mu.Unlock()
		for _, h := range handlers {
			d.call(h, e)
		}
	}
}

func (d *dispatcher) call(h func(Event), e Event) {
	d.calling.Store(true)
	defer func() {
		if r := recover(); r != nil {
			d.log.Error("cluster: transition handler panicked", "node_id", e.NodeID, "event", string(e.Kind), "fencing_token", e.FencingToken, "panic", r)
		}
		d.calling.Store(false) // after the log, whose handler is the application's
	}()
	h(e)
}
