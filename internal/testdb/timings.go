package testdb

import "time"

// The timings every test node runs with unless a test says otherwise: the
// shortest lease and heartbeat Config.Validate accepts, so that a takeover
// takes about a second. Config uses them; a test that configures a node
// itself (over a fake provider, in a child process) uses them too, and a
// test that needs other timings names them and says why.
const (
	// LeaseTTL is Config.LeaseTTL: how long a lease lasts by the database
	// clock after its last renew, and so about how long a takeover from a
	// leader that vanished takes.
	LeaseTTL = time.Second

	// Heartbeat is Config.HeartbeatInterval: how often a leader renews and
	// a follower tries to acquire, and so about how long a follower takes
	// to learn of a change of leader or take a released lease.
	Heartbeat = 100 * time.Millisecond

	// FenceTimeout is Config.FenceTimeout: how long after the start of its
	// last successful renew a leader goes on believing it leads. A leader
	// cut off from its database stops leading within it, before its lease
	// (LeaseTTL) can expire and another node take over.
	FenceTimeout = 700 * time.Millisecond
)
