// Package provider is the seam between a cluster node and the store that
// holds its lease: the interfaces a provider implements and the values
// they exchange, as database/sql/driver is for database/sql. Applications
// use package cluster; they need this package only to write or wrap a
// provider. cluster.DBProvider implements every interface here over
// PostgreSQL, MySQL/MariaDB and SQLite, and providertest checks a provider
// against the contract.
//
// Errors a provider returns wrap the sentinels of package cluster
// (cluster.ErrLeaseLost, cluster.ErrStaleFencingToken,
// cluster.ErrPoolExhausted, ...) or are its *cluster.LeaseHeldError and
// *cluster.LaneHeldError, so that a node can tell them apart.
package provider

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// ErrNotMember is what [MemberStore.Seen] wraps when the member has no
// row: the node then joins again.
var ErrNotMember = errors.New("provider: no membership row")

// A Provider stores the lease that elects the leader. The default provider
// keeps it in one row of the configured database (see cluster.Config.DB); set
// cluster.Config.Provider to use another store.
//
// Implementations must be safe for concurrent use and must decide expiry
// by one clock shared by every node (the database's), never by the caller's.
// A Cluster calls Acquire, Renew and Release from one goroutine at a time
// and Leader from any goroutine.
type Provider interface {
	// Acquire grants req.Holder a new term of the lease named req.Name if
	// the lease is free or expired, with a fencing token greater than every
	// token granted before for that name. If another term holds an unexpired
	// lease, Acquire returns a *cluster.LeaseHeldError.
	Acquire(ctx context.Context, req LeaseRequest) (Lease, error)

	// Renew extends the term described by l by ttl. It must match the name,
	// holder, instance and fencing token of l, and the lease must not have
	// expired; otherwise it returns cluster.ErrLeaseLost.
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
	Name     string        // lease name, see cluster.Config.LeaseName
	Holder   string        // the requesting node's NodeID
	Instance string        // random per cluster.New; tells apart processes sharing a NodeID
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
	Name         string // the lease's name (Config.LeaseName)
	Holder       string // the NodeID of the node that holds it
	Instance     string // the holding node's instance, new each New
	Endpoint     string // the holder's Config.Endpoint, for discovery
	FencingToken uint64 // the term's token, higher than every earlier term's
	// ExpiresAt is the expiry by the provider's clock. It is informational:
	// a node's own belief in its leadership ends on its monotonic clock.
	ExpiresAt time.Time
}

// Leader describes the node that holds the lease.
type Leader struct {
	// NodeID is the leader's cluster.Config.NodeID.
	NodeID string
	// Endpoint is the leader's cluster.Config.Endpoint, empty when not configured.
	Endpoint string
	// FencingToken is the token of the leader's current term.
	FencingToken uint64
	// LeaseExpiresAt is when the lease expires unless renewed, by the
	// database clock. It is the zero Time in single-node mode, where the
	// lease never expires.
	LeaseExpiresAt time.Time
}

// Initializer is an optional interface for a [Provider] that must prepare
// its store (create tables, check versions) before use. cluster.New calls Init
// once before the first Acquire, unless cluster.Config.SkipMigrations is set.
type Initializer interface {
	Init(ctx context.Context) error
}

// SchemaChecker is an optional interface for a [Provider] whose store has
// a schema: with cluster.Config.SkipMigrations, cluster.New calls CheckSchema instead
// of Init, which must run no DDL and fail, wrapping cluster.ErrSchema and saying
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
// transaction, to fence it, or a connection. cluster.Cluster.Fence,
// cluster.Cluster.ClaimLane and cluster.Cluster.AdvanceTip take a cluster.Tx that is one
// (or a database/sql handle, which they adapt themselves), so a driver
// other than database/sql needs only an adapter (clusterpgx.Tx for pgx).
type Querier interface {
	// Exec runs a statement that returns no rows and reports how many rows
	// it changed.
	Exec(ctx context.Context, query string, args ...any) (rowsAffected int64, err error)
	// QueryRow runs a statement that returns at most one row. Scanning a
	// missing row returns an error that matches [database/sql.ErrNoRows]
	// (pgx.ErrNoRows matches it since pgx v5.6).
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// A Row is the result of [Querier.QueryRow]; *sql.Row and pgx.Row are
// Rows.
type Row interface {
	Scan(dest ...any) error
}

// A RowsQuerier is a [Querier] that also returns many rows; the
// connections of a [Pool] must be RowsQueriers for cluster.DBProvider.Members.
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
// the application writes to. cluster.New finds them by type assertion and
// refuses a Config whose integrity features its provider cannot serve:
// Chains and WitnessFile need a [ChainStore], VaultKeys a [StateStore].
// The default providers implement all of them, so a wrapper that embeds
// *cluster.DBProvider (to add metrics or tracing) keeps them, as does one
// that implements each method by calling the DBProvider's (a wrapper by
// delegation keeps a capability only if it has the method: the node finds
// capabilities by type assertion on the provider it was given).
type (
	// A Fencer checks, inside the caller's transaction tx, that l is the
	// current unexpired term, and holds that fact until tx ends. It returns
	// an error wrapping cluster.ErrStaleFencingToken when it is not. ttl bounds,
	// on the server where the database can, how long tx may wait for the
	// lease row and then sit idle.
	Fencer interface {
		Fence(ctx context.Context, tx Querier, l Lease, ttl time.Duration) error
	}

	// A ChainStore keeps the tips of hash-chained tables (cluster.Config.Chains)
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
// cluster's membership, one row per node process (see cluster.Cluster.Members).
type MemberStore interface {
	// Join records this node process as an active member of scope (the
	// lease name), seen now, with its node timeout (m.Timeout).
	Join(ctx context.Context, scope string, m Member) error
	// Seen refreshes the member's last_seen. When the instance has no
	// row in scope (it was removed or taken over while the member went
	// unseen), it returns an error wrapping [ErrNotMember], and the node
	// joins again.
	Seen(ctx context.Context, scope, instance string) error
	// Leave marks the member as left.
	Leave(ctx context.Context, scope, instance string) error
	// Members lists the members of scope. A member is Live while active
	// and seen, by the store's clock, within the Timeout it recorded when
	// it joined, or within timeout when it recorded none. At most one
	// member Leads: the one the lease names while its term is unexpired.
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
	// Timeout is the member's node timeout, which it records when it
	// joins: its LeaseTTL and three heartbeats. Live is judged by it, so
	// every reader agrees whatever its own settings; 0 in a row written by
	// a store that does not record it, which readers judge by their own.
	Timeout time.Duration `json:"-"`
	// Live reports an active member seen within its node timeout.
	Live bool `json:"live"`
	// Leader reports the member whose term the lease row names, unexpired.
	Leader bool `json:"leader"`
}

// A ChainTip is the recorded tip of a chain.
type ChainTip struct {
	Chain        string // the chain's name (Config.Chains)
	Lease        string // the lease whose term writes it
	Counter      uint64 // the tip's position, counted by the application
	Hash         []byte // the hash of the row at the tip
	FencingToken uint64 // the token of the term that advanced it
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

// A Transactor is an optional capability of a [Provider]: InTx runs f in
// a transaction of the provider's own, on a connection of its own, and
// commits it when f returns nil (rolls it back otherwise, and returns f's
// error). cluster.Cluster.WorkLanes claims lanes through it, with the
// [LaneStore] in the same provider; the default providers implement it.
type Transactor interface {
	InTx(ctx context.Context, f func(tx Querier) error) error
}

// The provider's side of lanes (cluster.Cluster.ClaimLane) and of the config
// version (cluster.Cluster.ConfigVersion): two optional capabilities of a
// [Provider], found by type assertion like the others. The default
// providers implement both.
type (
	// A LaneStore keeps lanes: one row per lane key and scope (the lease
	// name) naming the node process that owns it until it expires, by the
	// store's clock, under a fencing token of the lane's own that grows
	// with every new claim and never goes back.
	LaneStore interface {
		// PeekLane reads, in tx and without locking it, lane req.Key of
		// req.Scope (nil when it was never claimed) and the census its
		// fair share is computed from; window is how recently a lane must
		// have been held, and a member seen, to count.
		PeekLane(ctx context.Context, tx Querier, req LaneRequest, window time.Duration) (*Lane, LaneCensus, error)
		// ClaimLane claims lane req.Key for req.Instance in tx if it is
		// free or expired, with a token above every token it was granted
		// before, or renews it, keeping its token, if req.Instance holds
		// it; the claim holds until tx ends: no other instance can claim
		// the lane meanwhile. A lane another instance holds returns a
		// *cluster.LaneHeldError.
		ClaimLane(ctx context.Context, tx Querier, req LaneRequest) (Lane, error)
		// RenewLanes extends every unexpired lane of instance by ttl and
		// reports the instance's lanes, the census, and the config version
		// of scope when there is one.
		RenewLanes(ctx context.Context, scope, instance string, ttl, window time.Duration) (LaneReport, error)
		// ReleaseLane expires the instance's claim on a lane at once,
		// keeping its token. Releasing a lane the instance does not hold
		// is not an error.
		ReleaseLane(ctx context.Context, scope, key, holder, instance string) error
		// ReleaseLanes expires every claim of the instance at once.
		ReleaseLanes(ctx context.Context, scope, holder, instance string) error
		// ReadLane reads lane key of scope on a connection of its own,
		// held or not (nil when it was never claimed), without locking it.
		ReadLane(ctx context.Context, scope, key string) (*Lane, error)
		// JoinLanes records that the member instance takes lanes, so that
		// it counts towards their fair share while it is live.
		JoinLanes(ctx context.Context, scope, instance string) error
	}

	// A ConfigStore keeps one config version per scope (the lease name),
	// which only ever grows.
	ConfigStore interface {
		// ReadConfigVersion reads the version, creating it at 0 when absent.
		ReadConfigVersion(ctx context.Context, scope string) (uint64, error)
		// BumpConfigVersion increments the version atomically and returns
		// the version it set.
		BumpConfigVersion(ctx context.Context, scope string) (uint64, error)
	}
)

// A LaneRequest asks a [LaneStore] to claim a lane.
type LaneRequest struct {
	Scope    string        // the lease name, see cluster.Config.LeaseName
	Key      string        // the lane
	Holder   string        // the claiming node's NodeID
	Instance string        // its process; see [LeaseRequest]
	TTL      time.Duration // how long the claim lasts unless renewed, by the store's clock
}

// A Lane is a lane's row as a [LaneStore] reads it. Times are by the
// store's clock.
type Lane struct {
	Key          string // the lane's key
	Holder       string // "" for a lane never claimed
	Instance     string
	FencingToken uint64 // 0 for a lane never claimed
	AcquiredAt   time.Time
	RenewedAt    time.Time // or released
	ExpiresAt    time.Time
	// Remaining is how long the claim had left when it was read, by the
	// store's clock; not positive when the lane is free.
	Remaining time.Duration
}

// LaneCensus is what a node's share of the lanes is computed from.
type LaneCensus struct {
	// Lanes counts the lanes of the scope held within the window: claimed,
	// renewed or released that recently.
	Lanes int
	// Mine counts the instance's unexpired lanes.
	Mine int
	// Members counts the other live members that take lanes.
	Members int
	// Elders counts the live members with the requesting node's NodeID
	// (another process given the same NodeID) that started before the
	// requesting instance: a duplicate is refused new lanes while its
	// elder lives, as it is refused the lease. A store that cannot tell
	// leaves it 0.
	Elders int
	// Loads has one entry per member counted in Members: how many
	// unexpired lanes it holds, and whether it sorts before the requesting
	// instance. The share rule uses them to spread the lanes to within one
	// of even; a store that leaves them out gets a share of ⌈lanes /
	// members⌉, which may settle 4 lanes over 3 members as 2/2/0.
	Loads []MemberLoad
}

// A MemberLoad is one member's part in a [LaneCensus].
type MemberLoad struct {
	Lanes int // the member's unexpired lanes
	// Before reports that the member sorts before the requesting instance
	// by NodeID, then instance, in the store's order: when the lanes do
	// not divide evenly, the members that sort first hold one more.
	Before bool
}

// LaneReport is what [LaneStore.RenewLanes] returns.
type LaneReport struct {
	Held   []Lane // the instance's unexpired lanes
	Census LaneCensus
	// ConfigVersion is the scope's config version, when HasConfigVersion:
	// the default provider reads it in the same statements.
	ConfigVersion    uint64
	HasConfigVersion bool
}

// A Pool gives cluster.DBProvider connections of any driver. Conn returns a
// connection for the provider's use alone (statements that must run on
// one session: a schema transaction, MySQL's LAST_INSERT_ID) and a func
// that gives it back. An error that means no connection became free in
// time should wrap cluster.ErrPoolExhausted.
type Pool interface {
	Conn(ctx context.Context) (conn Querier, release func(), err error)
}

// A ReleaseWatcher is an optional capability of a [Provider]: it tells a
// node at once when the lease is released, so that a follower tries to
// acquire it then rather than at its next poll. Correctness never depends
// on it: a node that hears nothing polls as before.
type ReleaseWatcher interface {
	// WatchReleases calls wake when the lease named name may have been
	// released by a node other than instance, until stop is called. It
	// returns once a release made through the same provider would wake
	// the caller. It calls live(true) while it hears the releases made by
	// other processes (a PostgreSQL LISTEN is connected) and live(false)
	// when it stops hearing them. stop returns once no call of wake or
	// live is in flight and none will follow. ctx carries values only
	// (loggers, traces): stop, not ctx, ends the watch.
	WatchReleases(ctx context.Context, name, instance string, wake func(), live func(bool)) (stop func())
}

// A ListenPool is a [Pool] that can LISTEN on PostgreSQL. Listen holds a
// connection of its own, LISTENs on channel, calls ready once it listens
// and notify with each notification's payload, until ctx is done (then it
// returns nil) or the connection fails (then it returns the error).
// clusterpgx's pools implement it.
type ListenPool interface {
	Pool
	Listen(ctx context.Context, channel string, ready func(), notify func(payload string)) error
}

// A Chain names a hash-chained, append-only table (an audit log, a consent
// log, a ledger) whose tip the cluster records and checks. Each row of the
// table has a monotonic counter and a hash of the row.
type Chain struct {
	// Name identifies the chain in the <prefix>chain_tips table. Required;
	// at most 128 bytes of printable UTF-8.
	Name string
	// Table is the chain's table, optionally qualified by its schema
	// ("audit.events"). Each part must match ^[a-z_][a-z0-9_]{0,62}$.
	Table string
	// CounterColumn holds the row's monotonic counter, an integer.
	// Default "monotonic_counter".
	CounterColumn string
	// HashColumn holds the row's hash, as bytes or text. Default "row_hash".
	HashColumn string
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

// optional is s, or nil when s is empty: a JSON null.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
