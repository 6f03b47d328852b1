package cluster

import "context"

// The package-level twins of the lane and config-version methods, for the
// default instance (see default.go and the package doc's table of its
// states). In single-node mode (Init never called) this process is the
// only worker: it owns every lane, claims return token 0 without touching
// the database, and the config version is 0 and never changes. While Init
// runs, after it failed and after Shutdown they fail closed, as Fence does.

// ClaimLane claims lane key in tx with the default instance and returns
// the lane's token; see [Cluster.ClaimLane]. When [Init] was never called
// it returns 0 and nil without touching tx; while Init runs, after it
// failed and after [Shutdown] it returns the error [Fence] would, which
// wraps [ErrStaleFencingToken].
func ClaimLane(ctx context.Context, tx DBTX, key string) (uint64, error) {
	return ClaimLaneWith(ctx, sqlQuerier{tx}, key)
}

// ClaimLaneWith is [ClaimLane] for a transaction of any driver; see
// [Cluster.ClaimLaneWith].
func ClaimLaneWith(ctx context.Context, tx Querier, key string) (uint64, error) {
	s := std.state.Load()
	if s == nil {
		return 0, checkLaneKey(key)
	}
	if c := s.member(); c != nil {
		return c.ClaimLaneWith(ctx, tx, key)
	}
	return 0, s.errFence
}

// OwnsLane reports whether this process believes it owns lane key; see
// [Cluster.OwnsLane]. It is true for every key when [Init] was never
// called, and false while Init runs, after it failed and after
// [Shutdown].
func OwnsLane(key string) bool {
	s := std.state.Load()
	if s == nil {
		return true
	}
	if c := s.member(); c != nil {
		return c.OwnsLane(key)
	}
	return false
}

// Lanes returns the lanes this process believes it owns; see
// [Cluster.Lanes]. It returns nil when [Init] was never called (every lane
// is this process's, and none was named), while Init runs, after it failed
// and after [Shutdown].
func Lanes() []string {
	if c := memberOf(std.state.Load()); c != nil {
		return c.Lanes()
	}
	return nil
}

// ReleaseLane releases lane key; see [Cluster.ReleaseLane]. It does
// nothing and returns nil when [Init] was never called, while Init runs
// and after it failed (nothing is held), and returns an error wrapping
// [ErrShutdown] after [Shutdown].
func ReleaseLane(ctx context.Context, key string) error {
	s := std.state.Load()
	switch {
	case s == nil:
		return nil
	case s.kind == stdDown:
		return s.errNotLeader
	}
	if c := s.member(); c != nil {
		return c.ReleaseLane(ctx, key)
	}
	return nil
}

// LaneOwner reads who holds lane key now; see [Cluster.LaneOwner]. When
// [Init] was never called this process holds every lane for good: it
// returns, without I/O, a Lane naming key and [SingleNodeID] as its
// Holder, with token 0 and a zero ExpiresAt (it never expires). While
// Init runs, after it failed and after [Shutdown] it returns the error
// [CurrentLeader] would.
func LaneOwner(ctx context.Context, key string) (*Lane, error) {
	s := std.state.Load()
	if s == nil {
		if err := checkLaneKey(key); err != nil {
			return nil, err
		}
		return &Lane{Key: key, Holder: SingleNodeID}, nil
	}
	if c := s.member(); c != nil {
		return c.LaneOwner(ctx, key)
	}
	return nil, s.errLeader
}

// ConfigVersion reads the cluster's config version; see
// [Cluster.ConfigVersion]. When [Init] was never called it is 0; while
// Init runs, after it failed and after [Shutdown] it returns the error
// [CurrentLeader] would.
func ConfigVersion(ctx context.Context) (uint64, error) {
	s := std.state.Load()
	if s == nil {
		return 0, nil
	}
	if c := s.member(); c != nil {
		return c.ConfigVersion(ctx)
	}
	return 0, s.errLeader
}

// ConfigVersionCached returns the config version last seen; see
// [Cluster.ConfigVersionCached]. It is 0 when [Init] was never called,
// while Init runs and after it failed; after [Shutdown] it is the last
// version the member saw.
func ConfigVersionCached() uint64 {
	if c := memberOf(std.state.Load()); c != nil {
		return c.ConfigVersionCached()
	}
	if c := Default(); c != nil {
		return c.conf.version.Load()
	}
	return 0
}

// BumpConfigVersion increments the cluster's config version; see
// [Cluster.BumpConfigVersion]. When [Init] was never called there is no
// cluster to tell: it bumps nothing and returns 0. While Init runs, after
// it failed and after [Shutdown] it returns the error [CurrentLeader]
// would.
func BumpConfigVersion(ctx context.Context) (uint64, error) {
	s := std.state.Load()
	if s == nil {
		return 0, nil
	}
	if c := s.member(); c != nil {
		return c.BumpConfigVersion(ctx)
	}
	return 0, s.errLeader
}
