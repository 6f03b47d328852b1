// Package cluster turns a Go service into a safe cluster member: leader
// election over one row of the database the service already runs
// (PostgreSQL, MySQL/MariaDB or embedded SQLite), fencing tokens issued by
// that database, and an [http.Handler] that tells load balancers who leads.
//
// When [Init] is never called the process is a permanent single leader:
// [IsLeader] is true, [FencingToken] is 0 and nothing touches a database.
// Once Init is called it never is again: a failed Init fails closed (see
// the default instance below). Several members can live in one process
// through [New].
//
// The lease lives wherever [Config.Provider] says; by default a
// [DBProvider] over [Config.DB]. The interfaces a provider implements, and
// the values they exchange, are package github.com/sqlfence/cluster/provider
// (as database/sql/driver is for database/sql); applications need it only
// to write or wrap a provider.
//
// # How election works
//
// Each lease is a row of the table <prefix>lease (default cluster_lease)
// with the columns name, holder, instance, fencing_token, acquired_at,
// renewed_at, expires_at and endpoint; times are unix milliseconds. A node
// acquires the lease with one conditional statement that succeeds only if
// the row is free or expired by the database's own clock
// (clock_timestamp() on PostgreSQL, UTC_TIMESTAMP(6) on MySQL, the host
// clock on SQLite), and that increments the row's fencing token in the same
// statement. The leader renews every [Config.HeartbeatInterval]; a renew
// matches the holder, the instance (random per [New]) and the token, so no
// other process, not even one started with the same NodeID, can renew or
// steal a live term. Followers learn from each failed attempt how long the
// lease has left by the database clock, and try again when it expires, or
// after one heartbeat, whichever is sooner. A release wakes them at once:
// the nodes that share its provider through it, and on PostgreSQL
// followers that LISTEN (clusterpgx's providers) through the one NOTIFY
// the release sends; each woken follower makes one attempt. While they
// hear, followers poll only when the lease is due to expire
// ([Config.PollOnly] turns the watch off). No node ever compares its wall
// clock with another's.
//
// # The trust window
//
// A leader's belief in its leadership ends at the start of its last
// successful acquire or renew attempt plus [Config.FenceTimeout], measured
// on its own monotonic clock. The database cannot have expired the lease
// before then: the statement ran after the attempt started, and
// FenceTimeout is shorter than [Config.LeaseTTL]. [Cluster.IsLeader]
// compares that deadline with the clock on every call, without locks or
// allocation, so it turns false on time even if no goroutine of ours ran:
// a process resuming from a long pause sees false on its first call. When
// the window ends without a successful renew the node reports lease-lost
// with reason "self-fenced" and campaigns again for a new term.
//
// # Leader work
//
// [Cluster.RunWhileLeader] runs a function in every term this node leads,
// with a context that ends with the term: a timer armed from the trust
// window's deadline cancels it a moment before IsLeader would turn false
// by itself, and a lost lease, [Cluster.Resign], [Cluster.Shutdown] or the
// caller cancel it too. Shutdown and Resign cancel it, wait for the work
// to return while they keep renewing the lease, and only then release it,
// so another node does not start the same work while this one still runs
// it. The context is a prompt signal; the guarantee is [Cluster.Fence]:
// a process paused between checking the context and writing is refused by
// the database.
//
// # Partitioned work
//
// Lanes spread keyed work (partitions, per-tenant queues, a sharded
// scheduler) over the nodes: [Cluster.ClaimLane] claims a key for this node
// inside the caller's transaction, which is the authority and holds the
// claim until it ends, and returns the key's own fencing token, which
// grows with every new claim and stays the same while the owner renews.
// A worker calls it first in every transaction that processes the key's
// next item; a node that lost the lane is refused ([ErrLaneHeld]).
// [Cluster.OwnsLane] is an allocation-free hint from a cache that a keeper
// goroutine refreshes when it renews the node's lanes, once per heartbeat.
// The lanes spread over the live members to within one of even (4 over
// 3 is 2/1/1), and a node holds at most [Config.MaxLanes]; the keeper
// hands over the lanes above a node's share ([ErrLaneLimit] refuses a
// claim above it). [Cluster.Shutdown] releases
// the node's lanes at once; the lanes of a node that died expire after
// [Config.LeaseTTL] by the database clock. [Cluster.LaneOwner] reads who
// holds any lane now, by the database clock, for reporting and routing;
// the events lane-acquired, lane-lost and lane-released follow this
// node's own lanes.
//
// [Cluster.BumpConfigVersion] increments a number per cluster that only
// grows; every other node that watches it ([Cluster.ConfigVersion],
// [Cluster.ConfigVersionCached]) emits config-version-changed within about
// a heartbeat.
//
// # Events
//
// A channel given to [Cluster.Notify] or [Config.Events] receives this
// node's transitions (lease-acquired, lease-lost, lease-released,
// rollback-detected, vault-key-rotated, config-version-changed,
// lane-acquired, lane-lost, lane-released) and leader-changed, which every
// node emits, followers included, when it learns of a new term or of the
// lease becoming free. Candidates learn it from the attempts they make
// anyway; nodes with [RoleFollower] read the lease about once per
// heartbeat. Config.Events gets every event from the first acquisition on,
// even one made before [New] returns; a channel registered later gets the
// events emitted after. As with package os/signal, the Cluster never
// blocks sending: give the channel a buffer (64 is plenty) and receive on
// a goroutine of your own, which may call Shutdown. [Event.Reason] is a
// [Reason] to switch on; free text is in Event.Detail and errors in
// Event.Err.
//
// # Fencing
//
// The fencing token grows with every acquisition, including a node taking
// the lease back, and is never reset by release, expiry or restart. A
// stale leader (paused, partitioned) may still try to write after a new
// leader took over; IsLeader narrows that window but cannot close it,
// because a pause can fall between the check and the write. Only the
// database can refuse such a write, by comparing the token the write
// carries with the current one in the same transaction: that is what
// [Cluster.Fence] and [Cluster.AdvanceTip] do.
//
// # What the database enforces
//
// The lease row is changed only by statements whose WHERE clause checks,
// by the database clock, that the lease is free or expired (acquire) or
// that it belongs to the caller's unexpired term (renew and release). Two
// nodes can therefore never both be granted the same unexpired lease, and
// tokens are strictly increasing per lease name; triggers refuse lowering a
// token and deleting, renaming, truncating or replacing a lease row, and
// the table <prefix>high_water keeps the highest token ever granted, so
// none is granted twice. Each guard raises its own SQLSTATE, mapped to a
// sentinel ([ErrStaleFencingToken], [ErrTipBackwards], [ErrTipRewritten],
// [ErrTipDeleted], [ErrLeaseDeleted], [ErrTokenLowered],
// [ErrRollbackDetected], [ErrLaneDeleted]). Lane rows carry the same
// guards: a lane's token never goes back and is never granted twice. "What holds on each dialect" in docs/guarantees.md says
// what MySQL cannot trap and what an operator must configure.
//
// [Cluster.Fence] checks the term inside the caller's transaction and holds
// the lease row for share until it ends, so every committed write fenced
// with token T commits before any acquisition of a later token;
// [Cluster.BeginFenced] begins a transaction and fences it in one call (on
// a pool of clusterpgx.OpenDB, with the BEGIN and the fence in one round
// trip). The chain
// tips table ([Config.Chains], [Cluster.AdvanceTip]) carries triggers that
// refuse a tip under a stale token, a tip moving backwards or rewritten at
// its counter with another hash, and deletes, in SQL, whoever writes. [New] and every acquisition compare each chain's
// table with its tip and, with [Config.WitnessFile], the database with what
// this node saw before, so a rolled-back database is refused
// ([ErrRollbackDetected]); [Config.VaultKeys] makes every node prove it
// holds the same vault keys ([ErrVaultKeyDrift]).
//
// # Failure modes
//
//   - Database unreachable: renews fail; the leader retries promptly while
//     its trust window lasts, then self-fences. After LeaseTTL no node
//     leads until the database answers again. Writes fail closed.
//   - Leader crash: its lease expires after at most LeaseTTL and a follower
//     acquires it with a higher token.
//   - Graceful shutdown: [Cluster.Shutdown] releases the lease (expires it,
//     keeping the token) on a context its caller cannot cancel, so a
//     follower takes over within about one heartbeat.
//   - Read-only database (a replica after failover), exhausted pool, missing
//     tables: errors wrap [ErrReadOnly], [ErrPoolExhausted] or [ErrSchema]
//     and say what to do; a transient error ends leadership only when the
//     trust window does.
//   - Rolling back the database to an earlier snapshot can re-issue tokens
//     that were already used; the chain checks and the witness file detect
//     it.
//
// # The default instance
//
// The package-level functions ([Init], [IsLeader], [FencingToken],
// [RequireLeader], [DiscoveryHandler], [Shutdown]) are the drop-in set:
// they answer for one member per process, the default instance, and
// everything else is a method of the *Cluster [Default] returns
// (cluster.Default().Fence(ctx, tx)). The default instance is in one of
// four states:
//
//	state              IsLeader  FencingToken  RequireLeader      Fence                      CurrentLeader     DiscoveryHandler          RunWhileLeader
//	never initialized  true      0             nil                nil and token 0            this process (*)  200, this process leads   fn once, token 0 (**)
//	running            as the methods of the member, a Cluster, answer
//	failed(err)        false     0             ErrNotLeader, err  ErrStaleFencingToken, err  err               503, "initialization failed"  waits for an Init
//	shut down          false     0             ErrShutdown        ErrShutdown (***)          ErrShutdown       503, "shut down"          ErrShutdown
//
// (*) with token 0 and a lease that never expires. (**) until its
// context ends: Init and Shutdown cancel it and wait for it. (***) which
// also matches ErrStaleFencingToken; ErrShutdown matches ErrNotLeader and
// carries HTTP status 503. Resign does nothing but in the running state,
// and returns ErrShutdown when shut down. "X, err" is an error
// that wraps both the sentinel X and the error Init returned, whose text
// it shows; errors wrapping [ErrNotLeader] carry HTTP status 503. The
// discovery handler never shows Init's error, only the short reason.
// BeginFenced answers as Fence, beginning the transaction first (and
// leaving none open when Fence refuses). AdvanceTip answers as Fence,
// except that before Init it returns an error wrapping [ErrInvalidConfig].
// ClaimLane answers as Fence, and OwnsLane as IsLeader: in single-node
// mode this process owns every lane and claims with token 0. LaneOwner
// answers as CurrentLeader: in single-node mode it names this process,
// with no expiry. Clustered is false until Init is called and true from
// then on, whatever the state (a Shutdown without Init leaves it false).
// ConfigVersion and BumpConfigVersion answer as CurrentLeader, except that
// in single-node mode the version is 0 and a bump changes nothing. NodeID
// is [SingleNodeID] until Init is called, and from then on the NodeID
// given to the last Init (SingleNodeID if that NodeID was itself invalid).
// Every call that takes a transaction refuses a nil one, in every state.
//
// Only "never initialized" is single-node mode. Init moves the instance to
// running or failed; a failed Init may be retried. While Init runs the
// methods answer as failed, with "Init has not returned yet" as the
// cause, until New has created the member; from then on they answer for it,
// so the receiver of its first lease-acquired sees it lead. [Shutdown]
// moves any state to shut down, for good: Init then returns
// [ErrAlreadyInitialized]. Shutdown may be called from any goroutine, the
// one receiving events included, even during Init.
//
// # Schema
//
// [New] reads <prefix>schema_version first and runs no DDL when it records
// this build's [SchemaVersion], so a node starts on a read-only replica or
// under a role without DDL rights. Otherwise it creates or upgrades the
// tables under a lock that serializes nodes booting at once
// (pg_advisory_xact_lock, GET_LOCK or BEGIN IMMEDIATE), waiting at most 5s
// for the tables. The DDL is in the schema directory of the module, one
// file per dialect.
package cluster
