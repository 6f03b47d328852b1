package cluster

import (
	"context"
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
	// expire. It must match the name, holder, instance and fencing token of
	// l. Releasing a lease that is not held is not an error.
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
	// Poll says that the requesting node found the lease held at its last
	// attempt and only checks, at its regular interval, whether that is
	// still so: a provider may first read the lease with a cheaper
	// statement and report it held (a *LeaseHeldError), attempting only
	// when it is free or expired. A provider may ignore it.
	Poll bool
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

// Initializer is an optional interface for a [Provider] that must prepare
// its store (create tables, check versions) before use. [New] calls Init
// once before the first Acquire, unless [Config.SkipMigrations] is set.
type Initializer interface {
	Init(ctx context.Context) error
}

// SchemaChecker is an optional interface for a [Provider] whose store has
// a schema: with [Config.SkipMigrations], [New] calls CheckSchema instead
// of Init, which must run no DDL and fail, wrapping [ErrSchema] and saying
// what to run, unless the schema is current.
type SchemaChecker interface {
	CheckSchema(ctx context.Context) error
}

// InstanceReleaser is an optional capability of a [Provider]: it releases
// whatever term an instance holds, whatever its token. A Cluster uses it
// on Shutdown after an acquisition whose outcome it could not learn (the
// reply was lost), so that a term it may hold is not left to expire.
// Without it, such a term expires after its TTL.
type InstanceReleaser interface {
	ReleaseInstance(ctx context.Context, name, holder, instance string) error
}

// A Querier runs statements on a database handle of any driver: a
// transaction, to fence it, or a connection. [Cluster.Fence],
// [Cluster.ClaimLane] and [Cluster.AdvanceTip] take a [Tx] that is one
// (or a database/sql handle, which they adapt themselves), so a driver
// other than database/sql needs only an adapter (clusterpgx.Tx for pgx).
type Querier interface {
	// Exec runs a statement that returns no rows and reports how many rows
	// it changed.
	Exec(ctx context.Context, query string, args ...any) (rowsAffected int64, err error)
	// QueryRow runs a statement that returns at most one row. Scanning a
	// missing row returns an error that matches [ErrNoRows].
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// A Row is the result of [Querier.QueryRow]; *sql.Row and pgx.Row are
// Rows.
type Row interface {
	Scan(dest ...any) error
}

// A RowsQuerier is a [Querier] that also returns many rows; the
// connections of a [Pool] must be RowsQueriers for [DBProvider.Members].
type RowsQuerier interface {
	Querier
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// Rows are the rows of [RowsQuerier.Query]; *sql.Rows are Rows.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// Optional capabilities of a [Provider] whose lease lives in the database
// the application writes to. [New] finds them by type assertion and
// refuses a Config whose integrity features its provider cannot serve:
// Chains and WitnessFile need a [ChainStore], VaultKeys a [StateStore].
// The default providers implement all of them, so a wrapper that embeds
// *[DBProvider] (to add metrics or tracing) keeps them.
type (
	// A Fencer checks, inside the caller's transaction tx, that l is the
	// current unexpired term, and holds that fact until tx ends. It returns
	// an error wrapping [ErrStaleFencingToken] when it is not. ttl bounds,
	// on the server where the database can, how long tx may wait for the
	// lease row and then sit idle.
	Fencer interface {
		Fence(ctx context.Context, tx Querier, l Lease, ttl time.Duration) error
	}

	// A ChainStore keeps the tips of hash-chained tables ([Config.Chains])
	// under fencing tokens, and answers the rollback checks.
	ChainStore interface {
		// WriteTip records tip in tx; the database refuses it unless its
		// token is the current unexpired term's of the lease it names, and
		// its counter does not go back (or stay with another hash).
		WriteTip(ctx context.Context, tx Querier, tip ChainTip) error
		// ReadTip reads a chain's recorded tip, in tx when tx is not nil.
		ReadTip(ctx context.Context, tx Querier, chain string) (tip ChainTip, ok bool, err error)
		// HighWater reads the highest value the database ever recorded for
		// scope: "lease/<name>" (a fencing token) or "chain/<name>" (a
		// counter).
		HighWater(ctx context.Context, scope string) (value uint64, ok bool, err error)
		// ChainRows reads, from the chain's own table, its highest counter
		// and the hash of the row at counter at.
		ChainRows(ctx context.Context, ch Chain, at uint64) (ChainRows, error)
		// LeaseToken reads the fencing token of the lease row, held or not:
		// 0 when there is none.
		LeaseToken(ctx context.Context, name string) (uint64, error)
	}

	// A StateStore keeps cluster-wide facts: the vault-key fingerprint.
	StateStore interface {
		ReadVaultState(ctx context.Context, scope string) (state VaultState, ok bool, err error)
		// InsertVaultState records fingerprint for scope unless a record
		// exists.
		InsertVaultState(ctx context.Context, scope, fingerprint, node string) error
		// RotateVaultState replaces fingerprint from with to, by compare
		// and set, and increments the rotation epoch; it reports whether
		// it did.
		RotateVaultState(ctx context.Context, scope, from, to, node string) (bool, error)
	}
)

// A MemberStore is an optional capability of a [Provider]: it keeps the
// cluster's membership, one row per node process (see [Cluster.Members]).
type MemberStore interface {
	// Join records this node process as an active member of scope (the
	// lease name), seen now.
	Join(ctx context.Context, scope string, m Member) error
	// Seen refreshes the member's last_seen.
	Seen(ctx context.Context, scope, instance string) error
	// Leave marks the member as left.
	Leave(ctx context.Context, scope, instance string) error
	// Members lists the members of scope; those not seen within timeout,
	// by the store's clock, are not Live. At most one member Leads: the
	// one the lease names while its term is unexpired.
	Members(ctx context.Context, scope string, timeout time.Duration) ([]Member, error)
	// SeenByLease reports whether Acquire and Renew refresh the caller's
	// last_seen themselves, in the same statement, so that Seen need not
	// be called by a candidate.
	SeenByLease() bool
}

// A Member is one node process of a cluster.
type Member struct {
	NodeID    string    `json:"nodeId"`
	Instance  string    `json:"instance"` // random per process
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	Endpoint  string    `json:"endpoint,omitempty"`
	StartedAt time.Time `json:"startedAt"` // by the database clock
	LastSeen  time.Time `json:"lastSeen"`  // by the database clock
	// SeenAgo is how long before the read the database last saw the
	// member, by the database clock of the read itself (0 when a heartbeat
	// landed during the read). It is what Live compares with the node
	// timeout, so the two never disagree.
	SeenAgo time.Duration `json:"-"`
	// Status is "active" while the process runs, "left" once it shut down.
	Status string `json:"status"`
	// Live reports an active member seen within the node timeout.
	Live bool `json:"live"`
	// Leader reports the member whose term the lease row names, unexpired.
	Leader bool `json:"leader"`
}

// A ChainTip is the recorded tip of a chain.
type ChainTip struct {
	Chain        string
	Lease        string // the lease whose term writes it
	Counter      uint64
	Hash         []byte
	FencingToken uint64
}

// ChainRows is what a chain's own table holds, as [ChainStore.ChainRows]
// reads it.
type ChainRows struct {
	Top    uint64 // the highest counter; valid when HasTop
	HasTop bool   // false when the table has no rows
	Hash   []byte // the hash of the row at the counter asked for
	Found  bool   // false when no row has that counter
}

// VaultState is the recorded vault-key fingerprint of a cluster.
type VaultState struct {
	Fingerprint   string
	RotationEpoch uint64
	RecordedAt    time.Time // by the database clock
	RecordedBy    string    // the node that recorded it
}
