package cluster

import "context"

// The package-level twins of the lane and config-version methods, for the
// default instance (see default.go and the package doc's table of its
// states). In single-node mode (Init never called) this process is the
// only worker: it owns every lane, claims return token 0 without touching
// the database, and the config version is 0 and never changes. While Init
// runs, after it failed and after Shutdown they fail closed, as Fence does.

// stdClaimLane is ClaimLane on the default instance: when Init was never
// called it returns 0 without touching tx; while Init runs, after it
// failed and after Shutdown it returns the error Fence would.
func stdClaimLane(ctx context.Context, tx Tx, key string) (uint64, error) {
	if _, err := querierOf("ClaimLane", tx); err != nil {
		return 0, err
	}
	s := std.state.Load()
	if s == nil {
		return 0, checkLaneKey(key)
	}
	if c := s.member(); c != nil {
		return c.ClaimLane(ctx, tx, key)
	}
	return 0, s.errFence
}

// stdOwnsLane reports whether this process believes it owns lane key; see
// [Cluster.OwnsLane]. It is true for every key when [Init] was never
// called, and false while Init runs, after it failed and after
// [Shutdown].
func stdOwnsLane(key string) bool {
	s := std.state.Load()
	if s == nil {
		return true
	}
	if c := s.member(); c != nil {
		return c.OwnsLane(key)
	}
	return false
}

// stdLanes returns the lanes this process believes it owns; see
// [Cluster.Lanes]. It returns nil when [Init] was never called (every lane
// is this process's, and none was named), while Init runs, after it failed
// and after [Shutdown].
func stdLanes() []string {
	if c := memberOf(std.state.Load()); c != nil {
		return c.Lanes()
	}
	return nil
}

// stdReleaseLane releases lane key; see [Cluster.ReleaseLane]. It does
// nothing and returns nil when [Init] was never called, while Init runs
// and after it failed (nothing is held), and returns an error wrapping
// [ErrShutdown] after [Shutdown].
func stdReleaseLane(ctx context.Context, key string) error {
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

// stdLaneOwner reads who holds lane key now; see [Cluster.LaneOwner]. When
// [Init] was never called this process holds every lane for good: it
// returns, without I/O, a Lane naming key and [SingleNodeID] as its
// Holder, with token 0 and a zero ExpiresAt (it never expires). While
// Init runs, after it failed and after [Shutdown] it returns the error
// CurrentLeader would.
func stdLaneOwner(ctx context.Context, key string) (*Lane, error) {
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

// stdConfigVersion reads the cluster's config version; see
// [Cluster.ConfigVersion]. When [Init] was never called it is 0; while
// Init runs, after it failed and after [Shutdown] it returns the error
// CurrentLeader would.
func stdConfigVersion(ctx context.Context) (uint64, error) {
	s := std.state.Load()
	if s == nil {
		return 0, nil
	}
	if c := s.member(); c != nil {
		return c.ConfigVersion(ctx)
	}
	return 0, s.errLeader
}

// stdConfigVersionCached returns the config version last seen; see
// [Cluster.ConfigVersionCached]. It is 0 when [Init] was never called,
// while Init runs and after it failed; after [Shutdown] it is the last
// version the member saw.
func stdConfigVersionCached() uint64 {
	if c := memberOf(std.state.Load()); c != nil {
		return c.ConfigVersionCached()
	}
	if s := std.state.Load(); s != nil && s.kind == stdDown && s.c != nil {
		return s.c.conf.version.Load()
	}
	return 0
}

// stdBumpConfigVersion increments the cluster's config version; see
// [Cluster.BumpConfigVersion]. When [Init] was never called there is no
// cluster to tell: it bumps nothing and returns 0. While Init runs, after
// it failed and after [Shutdown] it returns the error CurrentLeader
// would.
func stdBumpConfigVersion(ctx context.Context) (uint64, error) {
	s := std.state.Load()
	if s == nil {
		return 0, nil
	}
	if c := s.member(); c != nil {
		return c.BumpConfigVersion(ctx)
	}
	return 0, s.errLeader
}
