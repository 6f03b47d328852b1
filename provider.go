package cluster

import (
	"context"
	"encoding/json"
	"time"
)

// A Provider stores the lease that elects the leader. The default provider
// keeps it in one row of the configured database (see [Config.DB]); set
// [Config.Provider] to use another store.
//
// Implementations must be safe for concurrent use and must decide expiry
// by one clock shared by every node (the database's), never by the caller's.
// A Cluster calls Acquire, Renew and Release from one goroutine at a time
// and Leader from any goroutine.
type Provider interface {
	// Acquire grants req.Holder a new term of the lease named req.Name if
	// the lease is free or expired, with a fencing token greater than every
	// token granted before for that name. If another term holds an unexpired
	// lease, Acquire returns a [*LeaseHeldError].
	Acquire(ctx context.Context, req LeaseRequest) (Lease, error)

	// Renew extends the term described by l by ttl. It must match the name,
	// holder, instance and fencing token of l, and the lease must not have
	// expired; otherwise it returns [ErrLeaseLost].
	Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)

	// Release expires the term described by l at once, keeping its fencing
	// token, so another node can acquire the lease without waiting for it to
	// expire. A FencingToken of 0 in l releases any term held by l's
	// instance. Releasing a lease that is not held is not an error.
	Release(ctx context.Context, l Lease) error

	// Leader returns the holder of the unexpired lease named name, or nil
	// and no error when nobody holds it.
	Leader(ctx context.Context, name string) (*Leader, error)
}

// A LeaseRequest asks [Provider.Acquire] for a new term of a lease.
type LeaseRequest struct {
	Name     string        // lease name, see [Config.LeaseName]
	Holder   string        // the requesting node's NodeID
	Instance string        // random per [New]; tells apart processes sharing a NodeID
	Endpoint string        // the requesting node's endpoint, published to followers
	TTL      time.Duration // lease duration, by the provider's clock
}

// A Lease is one term of a lease, as granted by a [Provider].
type Lease struct {
	Name         string
	Holder       string
	Instance     string
	Endpoint     string
	FencingToken uint64
	// ExpiresAt is the expiry by the provider's clock. It is informational:
	// a node's own belief in its leadership ends on its monotonic clock.
	ExpiresAt time.Time
}

// Leader describes the node that holds the lease.
type Leader struct {
	// NodeID is the leader's [Config.NodeID].
	NodeID string
	// Endpoint is the leader's [Config.Endpoint], empty when not configured.
	Endpoint string
	// FencingToken is the token of the leader's current term.
	FencingToken uint64
	// LeaseExpiresAt is when the lease expires unless renewed, by the
	// database clock. It is the zero Time in single-node mode, where the
	// lease never expires.
	LeaseExpiresAt time.Time
}

// MarshalJSON encodes l as the discovery handler does:
// {"nodeId":…,"endpoint":…,"fencingToken":…,"leaseExpiresAt":…}, with the
// expiry in unix milliseconds and null for an empty endpoint or a lease
// that never expires.
func (l Leader) MarshalJSON() ([]byte, error) {
	v := struct {
		NodeID         string  `json:"nodeId"`
		Endpoint       *string `json:"endpoint"`
		FencingToken   uint64  `json:"fencingToken"`
		LeaseExpiresAt *int64  `json:"leaseExpiresAt"`
	}{NodeID: l.NodeID, Endpoint: optional(l.Endpoint), FencingToken: l.FencingToken}
	if !l.LeaseExpiresAt.IsZero() {
		ms := l.LeaseExpiresAt.UnixMilli()
		v.LeaseExpiresAt = &ms
	}
	return json.Marshal(v)
}

// Initializer is an optional interface for a [Provider] that must prepare
// its store (create tables, check versions) before use. [New] calls Init
// once before the first Acquire.
type Initializer interface {
	Init(ctx context.Context) error
}
