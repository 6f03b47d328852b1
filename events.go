package cluster

import (
	"log/slog"
	"slices"
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
	Kind         EventKind // what happened
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

// notifier sends events to the channels registered with
// [Cluster.Notify] and [Config.Events], as package os/signal does: it
// never blocks, and an event that finds a channel full is dropped for that
// channel, counted and logged. The application's goroutines receive the
// events, so the Cluster has none to wait for and no caller to tell apart:
// a receiver may call [Cluster.Shutdown] like any other goroutine.
type notifier struct {
	log     *slog.Logger
	dropped atomic.Uint64

	mu     sync.Mutex // orders the sends of events emitted concurrently
	chans  []chan<- Event
	closed bool
}

// add registers ch; a nil ch, or one already registered, is ignored.
func (n *notifier) add(ch chan<- Event) {
	if ch == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if slices.Contains(n.chans, ch) {
		return
	}
	n.chans = append(n.chans, ch)
}

// emit sends e to every registered channel without blocking. Events
// emitted after close are not sent.
func (n *notifier) emit(e Event) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	for _, ch := range n.chans {
		select {
		case ch <- e:
		default:
			n.dropped.Add(1)
			n.log.Warn("cluster: event dropped: the channel passed to Notify is full; give it a larger buffer or receive faster",
				"node_id", e.NodeID, "event", string(e.Kind), "fencing_token", e.FencingToken, "lane", e.Lane,
				"buffer", cap(ch))
		}
	}
}

// close stops sending: Shutdown's last event has been sent.
func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
}
