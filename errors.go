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

	// ErrLeaseLost is returned by [Provider.Renew] when the lease is no
	// longer held by the term being renewed: it expired, was released, or
	// another node acquired it.
	ErrLeaseLost = errors.New("cluster: lease lost")

	// ErrLeaseHeld is returned by [Provider.Acquire] when another term holds
	// an unexpired lease. The error is a [*LeaseHeldError] with the details.
	ErrLeaseHeld = errors.New("cluster: lease held by another node")

	// ErrShutdown is returned by calls on a [Cluster] after [Cluster.Shutdown].
	ErrShutdown = errors.New("cluster: shut down")

	// ErrSchema reports that the cluster tables are missing, are of a newer
	// schema version than this library knows, or could not be created.
	ErrSchema = errors.New("cluster: schema")

	// ErrReadOnly reports that the database refused a write because it is
	// read-only, typically a replica after a failover.
	ErrReadOnly = errors.New("cluster: database is read-only")

	// ErrPoolExhausted reports that no connection became free in the
	// *sql.DB pool before the call's deadline.
	ErrPoolExhausted = errors.New("cluster: connection pool exhausted")
)

// statusError is an error that carries an HTTP status code.
type statusError struct {
	msg    string
	status int
}

func (e *statusError) Error() string   { return e.msg }
func (e *statusError) HTTPStatus() int { return e.status }

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
	// FencingToken is the holder's fencing token.
	FencingToken uint64
	// ExpiresAt is when the lease expires, by the database clock. Do not
	// compare it with the local clock; use Remaining.
	ExpiresAt time.Time
	// Remaining is how long the lease has left, measured by the database
	// clock at the time of the failed acquisition.
	Remaining time.Duration
}

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
