// Package providertest holds the conformance suite for [provider.Provider]
// implementations, and [Memory], an in-memory Provider that passes it, for
// tests of code that runs on a [cluster.Cluster] without a database.
//
// # Running the suite
//
// The default SQL provider runs the suite on every dialect. A third-party
// Provider should run it too, from a test in the implementation's own
// package, so that go test of that package checks it against the Provider
// contract:
//
//	func TestConformance(t *testing.T) {
//		providertest.Run(t, func(t *testing.T) func() provider.Provider {
//			store := newEmptyStore(t) // cleaned up with t.Cleanup
//			return func() provider.Provider { return openProvider(t, store) }
//		})
//	}
//
// # What the suite checks
//
// [Run] runs these subtests, each on a fresh store:
//
//   - AcquireFree: a free lease is granted with a nonzero token, the
//     request's name, holder, instance and endpoint, and an expiry; Leader
//     reports that term with the same expiry.
//   - NoLeader: Leader of a lease never acquired returns nil and no error.
//   - AcquireHeld: Acquire of a held lease, by another node or by the
//     holder itself, returns a [*cluster.LeaseHeldError] matching
//     [cluster.ErrLeaseHeld] that names the holder's node, instance,
//     endpoint and token; its ExpiresAt is the term's and Leader's, and its
//     Remaining is within (0, TTL].
//   - Renew: Renew keeps the term (name, holder, instance, endpoint and
//     token) and moves its expiry to the given ttl after the renewal, by
//     the store's clock: renewed for twice the TTL, the lease has more than
//     the TTL left, and Leader reports the new expiry.
//   - RenewMustMatchTerm: Renew with another name, holder, instance or
//     token returns [cluster.ErrLeaseLost]; the real term still renews.
//   - ReleaseThenAcquire: Release ends the term at once: Leader returns
//     nil, Renew returns ErrLeaseLost, and another node acquires without
//     waiting, with a greater token and its own (here empty) endpoint.
//   - ReleaseOldTerm: Release of an older term of an instance ends neither
//     that instance's newer term nor another node's term granted since.
//   - ReleaseInstance: a provider that implements
//     [provider.InstanceReleaser] ends the term of the given instance, and no
//     other instance's (skipped for a provider that does not).
//   - ReleaseTokenZeroIsNotSpecial: Release with token 0 releases nothing:
//     Release always matches the term's token.
//   - ReleaseByOtherIsNoop: Release with another name, holder or instance
//     than the term's returns nil and leaves the term held.
//   - ReleaseNotHeld: Release of a lease never acquired, or already
//     released, returns nil.
//   - TokensIncrease: 20 acquisitions by two nodes in turn, each released
//     before the next, get strictly increasing tokens, so none is reused.
//   - Expiry: once its TTL has passed, a term is expired: Leader returns
//     nil, Renew and a second Renew return ErrLeaseLost, Release returns
//     nil; another node then acquires with a greater token, and the old
//     term can neither renew nor release it.
//   - IndependentNames: leases of different names are held, reported and
//     released independently.
//   - ReleaseWakesWatchers: a provider that implements
//     [provider.ReleaseWatcher] wakes, within 5s, the watcher of another
//     instance when a term is released through it, and wakes no one once
//     the watch's stop has returned (skipped for a provider that does not).
//   - ConcurrentAcquire: 8 providers over one store calling Acquire at once
//     grant exactly one term; the others get ErrLeaseHeld. Three rounds,
//     the term released in between, with increasing tokens.
//   - ConcurrentAcquireReportsWinner: as ConcurrentAcquire, and each
//     LeaseHeldError names the term granted in that round, with Remaining
//     within (0, TTL], as in AcquireHeld: not the term released before it,
//     nor an empty one.
//
// # Lanes
//
// A provider that implements [provider.LaneStore] runs [RunLanes] too,
// with a [LaneTarget]: a func that opens one more provider over the store,
// and one that begins a transaction on it ([SQLTx] adapts a *sql.Tx;
// [NoTx] serves a store without transactions). Each subtest runs on a
// fresh store:
//
//   - ClaimFree: a free lane is granted with a nonzero token, the
//     request's holder and instance, and at most the TTL left; ReadLane
//     from another provider reports it.
//   - NeverClaimed: ReadLane and PeekLane of a lane never claimed return
//     nil, and the census of an empty store is zero.
//   - ClaimHeld: a claim of a lane another instance holds returns a
//     [*cluster.LaneHeldError] matching [cluster.ErrLaneHeld] that names
//     the holder, its instance and token, with (0, TTL] left.
//   - ClaimRenews: the holder's claim keeps the token and moves the expiry.
//   - ReleaseThenClaim: ReleaseLane with another key, holder or instance,
//     or of a lane never claimed, does nothing and returns nil; the
//     holder's frees the lane at once, keeping its token, and the next
//     claim gets a greater one.
//   - TokensIncrease: 10 claims by two nodes in turn, each released before
//     the next, get strictly increasing tokens.
//   - Expiry: once its TTL has passed a claim is free, RenewLanes no longer
//     renews it, and another node's claim gets a greater token.
//   - RenewLanes: it extends every unexpired lane of the instance, and
//     only those, reports them with their tokens, and counts the lanes
//     and the instance's own in the census.
//   - ReleaseLanes: it frees every lane of the instance and no other's.
//   - IndependentScopes: the same key in two scopes is two lanes.
//   - Census: PeekLane counts the lanes held, the caller's, and the other
//     members that joined (through [provider.MemberStore.Join] first, when
//     the provider implements it, then JoinLanes).
//   - ConcurrentClaim: 6 providers claiming one free lane at once, each in
//     its own transaction, are granted exactly one claim; the others get
//     ErrLaneHeld. Three rounds, with increasing tokens.
//   - ConfigVersion, for a [provider.ConfigStore]: the version starts at 0,
//     10 concurrent bumps from two providers return 1..10 once each, and
//     scopes are independent (skipped for a store without it).
//
// [Memory] passes it: it claims at once, ignoring the transaction, and
// [Memory.ExpireLane] ends a claim as a crash would.
//
// # Time
//
// Every subtest but Expiry acquires with a TTL of one minute, so that no
// lease expires while the subtest runs, and ends terms with Release.
// Expiry acquires with a TTL of one second and waits once for it to pass:
// about one second, measured with the Remaining the store reports. The
// suite makes 15 fresh stores and about 160 calls to them, one at a time
// except in the Concurrent subtests: about two seconds in all against a
// local database, most of it Expiry's wait. Run does not call t.Parallel;
// the caller may.
//
// # Testing leader-only code without a database
//
// A [Memory] is a lease store in the test's memory. Set it as
// [cluster.Config.Provider] of every node of a test, so they elect a
// leader among themselves as they would over one database row. It decides
// expiry by the clock it is given; with a [Clock], leases expire only when
// the test says so, and the test controls the store with no sleeps:
//
//   - [Memory.Expire] ends a lease's term at once, as the TTL running out
//     after a crash would.
//   - [Clock.Advance] moves the store's clock, expiring every lease whose
//     expiry it passes.
//   - [Memory.Disconnect] cuts a node off from the store, as a crash or a
//     network partition would; [Memory.Reconnect] heals it.
//
// None of these moves a Cluster's own clock. A node's heartbeat and trust
// window ([cluster.Config.FenceTimeout]) run on the real monotonic clock,
// so nodes notice a change in the store at their next heartbeat attempt,
// within [cluster.Config.HeartbeatInterval] of real time. Wait for that
// on an event ([cluster.Config.Events]) rather than a sleep. Short
// timings keep that quick: LeaseTTL 1s and HeartbeatInterval 100ms are the
// least the Config allows, with FenceTimeout 700ms between them.
package providertest
