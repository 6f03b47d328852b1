package cluster

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Sentinel errors. Compare with [errors.Is]; the messages of the errors
// actually returned add the field, value or node involved.
var (
	// ErrNotLeader reports that this node does not hold the lease. Errors
	// that wrap it carry HTTP status 503 (see [HTTPStatus]), so a handler
	// can answer a misrouted write without inspecting it further.
	ErrNotLeader error = &statusError{msg: "cluster: not leader", status: http.StatusServiceUnavailable}

	// ErrAlreadyInitialized is returned by a second call to [Init].
	ErrAlreadyInitialized = errors.New("cluster: already initialized")

	// ErrInvalidConfig is wrapped by every error from [Config.Validate].
	ErrInvalidConfig = errors.New("cluster: invalid config")

	// ErrLeaseLost is returned by [provider.Provider.Renew] when the lease is no
	// longer held by the term being renewed: it expired, was released, or
	// another node acquired it.
	ErrLeaseLost = errors.New("cluster: lease lost")

	// ErrLeaseHeld is returned by [provider.Provider.Acquire] when another term holds
	// an unexpired lease. The error is a [*LeaseHeldError] with the details.
	ErrLeaseHeld = errors.New("cluster: lease held by another node")

	// ErrShutdown is returned by every call on a [Cluster] after
	// [Cluster.Shutdown] that can fail. It also matches [ErrNotLeader] and
	// carries HTTP status 503.
	ErrShutdown error = &statusError{msg: "cluster: shut down", status: http.StatusServiceUnavailable, parent: ErrNotLeader}

	// ErrSchema reports that the cluster tables are missing, are of a newer
	// schema version than this library knows, or could not be created.
	ErrSchema = errors.New("cluster: schema")

	// ErrReadOnly reports that the database refused a write because it is
	// read-only, typically a replica after a failover.
	ErrReadOnly = errors.New("cluster: database is read-only")

	// ErrPoolExhausted reports that no connection became free in the
	// *sql.DB pool before the call's deadline.
	ErrPoolExhausted = errors.New("cluster: connection pool exhausted")

	// ErrStaleFencingToken reports that the database refused a fenced write
	// because the writer's fencing token is not that of the current,
	// unexpired lease. It also matches [ErrNotLeader] and carries HTTP
	// status 503.
	ErrStaleFencingToken error = &statusError{msg: "cluster: stale fencing token", status: http.StatusServiceUnavailable, parent: ErrNotLeader}

	// ErrTipBackwards reports an attempt to move a chain tip to a lower
	// counter, or below the highest counter it ever had; the database
	// refuses it.
	ErrTipBackwards = errors.New("cluster: chain tip would move backwards")

	// ErrTipRewritten reports an attempt to record another hash for a chain
	// tip at the counter it already has: a substituted row. The database
	// refuses it.
	ErrTipRewritten = errors.New("cluster: chain tip would be rewritten with another hash")

	// ErrTipDeleted reports an attempt to delete, truncate or rename a
	// chain tip; the database refuses it.
	ErrTipDeleted = errors.New("cluster: chain tips may not be deleted")

	// ErrLeaseDeleted reports an attempt to delete, truncate or rename a
	// lease row, which would start its fencing tokens again at 1; the
	// database refuses it.
	ErrLeaseDeleted = errors.New("cluster: lease rows may not be deleted")

	// ErrTokenLowered reports an attempt to lower a fencing token or a
	// high-water mark, or to hand a lease or lane to another holder
	// without a new token; the database refuses it.
	ErrTokenLowered = errors.New("cluster: fencing tokens may not go back")

	// ErrRollbackDetected reports that the database holds less than it once
	// did: a chain table lost rows or had one substituted, a lease row or
	// chain tip fell below the high-water mark the database keeps for it
	// (a truncated table on MySQL), or the database shows a lower fencing
	// token or chain tip than this node's witness file recorded. Restoring a
	// snapshot does this; so does tampering.
	ErrRollbackDetected = errors.New("cluster: database rollback detected")

	// ErrVaultKeyDrift reports that this node's vault keys differ from the
	// fingerprint the cluster recorded, and no rotation was declared.
	ErrVaultKeyDrift = errors.New("cluster: vault key drift")
)

// statusError is a sentinel that carries an HTTP status code and may be a
// special case of another sentinel.
type statusError struct {
	msg    string
	status int
	parent error
}

func (e *statusError) Error() string        { return e.msg }
func (e *statusError) HTTPStatus() int      { return e.status }
func (e *statusError) Is(target error) bool { return e.parent != nil && target == e.parent }

// HTTPStatus returns the HTTP status code that err carries, or 500 when it
// carries none. Errors wrapping [ErrNotLeader] carry 503.
func HTTPStatus(err error) int {
	var s interface{ HTTPStatus() int }
	if errors.As(err, &s) {
		return s.HTTPStatus()
	}
	return http.StatusInternalServerError
}

// LeaseHeldError reports who holds the lease that an acquisition wanted.
// It matches [ErrLeaseHeld] with [errors.Is].
type LeaseHeldError struct {
	// Holder is the NodeID of the node holding the lease.
	Holder string
	// Instance identifies the holder's process; two processes started with
	// the same NodeID have different instances.
	Instance string
	// Endpoint is the holder's [Config.Endpoint], empty when not configured.
	Endpoint string
	// FencingToken is the holder's fencing token.
	FencingToken uint64
	// ExpiresAt is when the lease expires, by the database clock. Do not
	// compare it with the local clock; use Remaining.
	ExpiresAt time.Time
	// Remaining is how long the lease has left, measured by the database
	// clock at the time of the failed acquisition.
	Remaining time.Duration
}

// Error says who holds the lease, under which token, and for how long.
func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("cluster: lease held by node %q (fencing token %d) for another %v",
		e.Holder, e.FencingToken, e.Remaining.Round(time.Millisecond))
}

// Is reports whether target is [ErrLeaseHeld].
func (e *LeaseHeldError) Is(target error) bool { return target == ErrLeaseHeld }

// configError names the field, the value and the rule it broke.
func configErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// Errors of lanes (see [Cluster.ClaimLane]).
var (
	// ErrLaneHeld reports that another node holds an unexpired claim on
	// the lane asked for. The error is a [*LaneHeldError] with the details.
	ErrLaneHeld = errors.New("cluster: lane held by another node")

	// ErrLaneLimit reports that a claim would take this node past its
	// share of the lanes or past [Config.MaxLanes]; the message says which.
	// Another node is expected to take the lane.
	ErrLaneLimit = errors.New("cluster: lane limit reached")

	// ErrMemberLive is what [DBProvider.Forget] returns for a node that
	// is live: it has an active process seen within the timeout.
	ErrMemberLive = errors.New("cluster: the member is live")

	// ErrDuplicateNodeID reports a lane claim refused because another live
	// process with the same [Config.NodeID] started first: a duplicate is
	// refused lanes, as it is refused the lease, until that process stops.
	ErrDuplicateNodeID = errors.New("cluster: another live process has this NodeID")

	// ErrLaneDeleted reports an attempt to delete, truncate or rename a
	// lane row, which would start its fencing tokens again at 1; the
	// database refuses it.
	ErrLaneDeleted = errors.New("cluster: lane rows may not be deleted")
)

// LaneHeldError reports who holds the lane that a claim wanted. It matches
// [ErrLaneHeld] with [errors.Is].
type LaneHeldError struct {
	// Lane is the lane's key.
	Lane string
	// Holder is the NodeID of the node holding the lane.
	Holder string
	// Instance identifies the holder's process.
	Instance string
	// FencingToken is the lane's token under the holder's claim.
	FencingToken uint64
	// ExpiresAt is when the claim expires unless renewed, by the database
	// clock. Do not compare it with the local clock; use Remaining.
	ExpiresAt time.Time
	// Remaining is how long the claim had left, by the database clock, when
	// it was read.
	Remaining time.Duration
}

// Error says who holds the lane, under which token, and for how long.
func (e *LaneHeldError) Error() string {
	return fmt.Sprintf("cluster: lane %q held by node %q (fencing token %d) for another %v",
		e.Lane, e.Holder, e.FencingToken, e.Remaining.Round(time.Millisecond))
}

// Is reports whether target is [ErrLaneHeld].
func (e *LaneHeldError) Is(target error) bool { return target == ErrLaneHeld }
