package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
	"github.com/sqlfence/cluster/internal/testdb"
)

// listening makes a node on PostgreSQL hear releases by LISTEN
// (clusterpgx's provider over its database/sql pool); elsewhere it
// changes nothing.
func listening(t *testing.T, tg testdb.Target) func(*cluster.Config) {
	return func(c *cluster.Config) {
		if tg.Dialect != cluster.Postgres {
			return
		}
		p, err := clusterpgx.NewStdlibProvider(c.DB, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		c.Provider, c.DB, c.TablePrefix = p, nil, ""
	}
}

// handOverTimings leave a successor room to find a term handed to it on
// a loaded machine: the grant lasts the margin (1s) plus two heartbeats,
// and the successor trusts what is left of it less the margin, about 1s,
// where it needs one statement (and adopts with a quarter of a second
// left at least).
func handOverTimings(c *cluster.Config) {
	c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 6*time.Second, 500*time.Millisecond, 5*time.Second
}

// A release by a leader that stops hands the lease over on PostgreSQL: in
// the commit that ends its term it grants the next token to the follower
// that listens, which leads by reading the row, with no grant of its own
// (the row's token is the old one plus one, and the follower counts the
// term as handed over). The follower then renews the short grant into a
// whole term. Elsewhere the follower acquires the lease as before.
func TestReleaseHandsLeaseOver(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a", handOverTimings, listening(t, tg))
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		b := start(t, tg, "b", handOverTimings, listening(t, tg))
		if tg.Dialect == cluster.Postgres {
			waitFor(t, 5*time.Second, "b to hear releases and take grants", func() bool {
				return b.Stats().HearingReleases && takesGrants(t, tg, b)
			})
		}
		token := a.FencingToken()
		if err := a.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, 2*time.Second, "b to lead after a stopped", b.IsLeader)
		t.Logf("b led %v after a's Shutdown returned", took.Round(time.Millisecond))
		if got := b.FencingToken(); got != token+1 {
			t.Fatalf("b leads with token %d; want %d, the next after a's %d", got, token+1, token)
		}
		s := b.Stats()
		if want := uint64(map[bool]int{true: 1}[tg.Dialect == cluster.Postgres]); s.HandedOver != want || s.Acquisitions != 1 {
			t.Fatalf("b: %d terms handed over of %d; want %d of 1", s.HandedOver, s.Acquisitions, want)
		}
		// The grant lasts 2s; b renews it into a term of its own.
		time.Sleep(3 * time.Second)
		if !b.IsLeader() || b.FencingToken() != token+1 {
			t.Fatalf("3s later b leads %v with token %d; want it still leading with %d", b.IsLeader(), b.FencingToken(), token+1)
		}
		l, err := b.CurrentLeader(ctx)
		if err != nil || l == nil || l.NodeID != "b" || l.FencingToken != token+1 {
			t.Fatalf("the lease row says %+v (%v); want b with token %d", l, err, token+1)
		}
	})
}

// takesGrants reports whether n's membership row says it takes the lease
// a release hands over.
func takesGrants(t *testing.T, tg testdb.Target, n *node) bool {
	t.Helper()
	var v int64
	err := n.db.QueryRowContext(context.Background(),
		"SELECT listener_pid FROM "+tg.Prefix+"nodes WHERE scope = 'leader' AND node_id = $1 AND status = 'active'", n.NodeID()).Scan(&v)
	if err != nil {
		t.Fatalf("read listener_pid of %s: %v", n.NodeID(), err)
	}
	return v != 0
}

// A member holding off after its Resign takes no grant: the database
// knows its hold-off (the release recorded it), so the next release hands
// the lease to a member that can lead. One whose hold-off the database
// does not know (here cleared by hand) is handed the lease and gives it
// back at once: the last member leads within a fraction of a heartbeat,
// under the token after the one handed over and given back, not when the
// grant expires.
func TestHandOverPassesOverOrIsGivenBackByNodeThatHoldsOff(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	holdOff := func(c *cluster.Config) {
		c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 10*time.Second, 500*time.Millisecond, 9*time.Second
		c.ResignHoldOff = 10 * time.Second
		listening(t, tg)(c)
	}
	a := start(t, tg, "a", holdOff) // the member that has run longest
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	rest := []*node{start(t, tg, "b", holdOff), start(t, tg, "c", holdOff), start(t, tg, "d", holdOff)}
	for _, n := range append(rest, a) {
		waitFor(t, 5*time.Second, n.NodeID()+" to take grants", func() bool { return takesGrants(t, tg, n) })
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	x := leaderOf(t, 2*time.Second, rest...)
	token := x.FencingToken()
	if err := x.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	var others []*node
	for _, n := range rest {
		if n != x {
			others = append(others, n)
		}
	}
	y := leaderOf(t, 2*time.Second, others...)
	if got := y.FencingToken(); got != token+1 || y.Stats().HandedOver == 0 {
		t.Fatalf("%s leads with token %d, %d terms handed over; want %d, handed over (a, holding off, passed over)", y.NodeID(), got, y.Stats().HandedOver, token+1)
	}
	if a.IsLeader() {
		t.Fatal("a leads while holding off")
	}

	// The database forgets that a holds off: y's release hands a the lease,
	// and a gives it back.
	if _, err := a.db.ExecContext(ctx, "UPDATE "+tg.Prefix+"nodes SET grants_after = 0 WHERE node_id = 'a'"); err != nil {
		t.Fatal(err)
	}
	z := others[0]
	if z == y {
		z = others[1]
	}
	token = y.FencingToken()
	if err := y.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 2*time.Second, z.NodeID()+" to lead after "+y.NodeID()+" resigned", z.IsLeader)
	t.Logf("%s led %v after %s resigned (a, handed the lease, holds off)", z.NodeID(), took.Round(time.Millisecond), y.NodeID())
	if took >= time.Second {
		t.Errorf("%s led %v after the release: about when the grant to a expired (2s), not at once", z.NodeID(), took.Round(time.Millisecond))
	}
	if got := z.FencingToken(); got != token+2 {
		t.Errorf("%s leads with token %d; want %d: %d handed to a and given back, then its own", z.NodeID(), got, token+2, token+1)
	}
	if a.IsLeader() || a.Stats().HandedOver != 0 {
		t.Errorf("a, holding off, leads %v with %d terms handed over", a.IsLeader(), a.Stats().HandedOver)
	}
}

// A release passes over a member whose listening connection is gone (its
// process died without leaving: its row still says it listens, and was
// seen lately): it hands the lease to one whose server process runs.
func TestHandOverPassesOverMemberWhoseListenerIsGone(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	a := start(t, tg, "a", handOverTimings, listening(t, tg))
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	// A member that has run longer than b, seen just now, whose listener's
	// server process is no more (a pid no process has: PostgreSQL's pids
	// are below 2^22 on Linux).
	if _, err := a.db.ExecContext(ctx, "INSERT INTO "+tg.Prefix+"nodes (scope, instance, node_id, host, pid, endpoint, started_at, last_seen, status, listener_pid) "+
		"SELECT 'leader', 'gone', 'ghost', 'h', 1, '', 0, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'active', 2147483000"); err != nil {
		t.Fatal(err)
	}
	b := start(t, tg, "b", handOverTimings, listening(t, tg))
	waitFor(t, 5*time.Second, "b to take grants", func() bool { return takesGrants(t, tg, b) })
	token := a.FencingToken()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 2*time.Second, "b to lead after a stopped", b.IsLeader)
	if got := b.FencingToken(); got != token+1 || b.Stats().HandedOver != 1 {
		t.Fatalf("b leads with token %d after %v, %d terms handed over; want %d, handed over (the ghost passed over)", got, took, b.Stats().HandedOver, token+1)
	}
}

// A node that finds a term under its own name that it never led (a
// release handed it over, or an attempt of its own committed and its
// answer was lost) trusts it only for what the database says is left of
// it, less the margin LeaseTTL - FenceTimeout: with every renew failing,
// IsLeader is false before the attempt's start plus that, however long
// FenceTimeout is.
func TestHandedOverTermTrustedOnlyForWhatIsLeft(t *testing.T) {
	t.Parallel()
	const remaining = 700 * time.Millisecond
	margin := testdb.LeaseTTL - testdb.FenceTimeout // 300ms
	var attemptAt atomic.Int64
	var once sync.Once
	p := &fakeProvider{
		AcquireFunc: func(_ context.Context, r cluster.LeaseRequest) (cluster.Lease, error) {
			var err error
			once.Do(func() {
				attemptAt.Store(time.Now().UnixNano())
				err = &cluster.LeaseHeldError{Holder: r.Holder, Instance: r.Instance, FencingToken: 7, Remaining: remaining}
			})
			if err != nil {
				return cluster.Lease{}, err
			}
			return cluster.Lease{}, &cluster.LeaseHeldError{Holder: "z", Instance: "z", FencingToken: 8, Remaining: time.Minute}
		},
		RenewFunc: func(context.Context, cluster.Lease, time.Duration) (cluster.Lease, error) {
			return cluster.Lease{}, errors.New("the database does not answer")
		},
	}
	n := startFake(t, p)
	var lastTrue time.Time
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		now := time.Now() // before the call: IsLeader was true at a time no earlier
		if n.IsLeader() {
			lastTrue = now
		} else if !lastTrue.IsZero() {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if lastTrue.IsZero() {
		t.Fatal("the node never led the term under its name")
	}
	trusted := lastTrue.Sub(time.Unix(0, attemptAt.Load()))
	t.Logf("led for %v of the %v left (margin %v)", trusted.Round(time.Millisecond), remaining, margin)
	if trusted >= remaining-margin {
		t.Fatalf("the node led %v after its attempt; the database gave the term %v, so it may lead %v at most", trusted, remaining, remaining-margin)
	}
	if s := n.Stats(); s.HandedOver != 1 || s.FencingToken != 0 {
		t.Fatalf("stats %+v; want one term handed over, over now", s)
	}
}

// A term found under the node's own name with too little left to renew
// in (less than the margin plus half a heartbeat) is not led: the node
// releases it and campaigns for one of its own.
func TestHandedOverTermTooShortIsReleased(t *testing.T) {
	t.Parallel()
	released := make(chan uint64, 4)
	var n atomic.Int32
	p := &fakeProvider{
		AcquireFunc: func(_ context.Context, r cluster.LeaseRequest) (cluster.Lease, error) {
			if n.Add(1) == 1 {
				return cluster.Lease{}, &cluster.LeaseHeldError{Holder: r.Holder, Instance: r.Instance, FencingToken: 7,
					Remaining: testdb.LeaseTTL - testdb.FenceTimeout + testdb.Heartbeat/4}
			}
			return cluster.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: 8}, nil
		},
		ReleaseFunc: func(_ context.Context, l cluster.Lease) error {
			released <- l.FencingToken
			return nil
		},
	}
	a := startFake(t, p)
	select {
	case tok := <-released:
		if tok != 7 {
			t.Fatalf("released token %d; want 7, the term too short to lead", tok)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the term too short to lead was not released")
	}
	waitFor(t, 3*time.Second, "a to lead a term of its own", a.IsLeader)
	if s := a.Stats(); a.FencingToken() != 8 || s.HandedOver != 0 {
		t.Fatalf("a leads with token %d, %d terms handed over; want 8 and none", a.FencingToken(), s.HandedOver)
	}
}

// A release that hands the lease over waits for its WAL flush, as every
// grant does, even on a session that commits asynchronously: a successor
// must never lead on a token a server crash could hand out again. One that
// only releases (no member to hand it to) does not wait. The test runs the
// statements in a transaction of its own, where the setting the function
// made for it can still be read, and rolls it back.
func TestHandOverCommitsSynchronously(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	a := start(t, tg, "a") // creates the tables
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	for _, c := range []struct {
		successor bool
		want      string
	}{{true, "on"}, {false, "off"}} {
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		q := func(query string, args ...any) *sql.Row { return tx.QueryRowContext(ctx, query, args...) }
		if _, err := tx.ExecContext(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
			t.Fatal(err)
		}
		var token int64
		if err := q("SELECT fencing_token FROM "+tg.Prefix+"acquire('h', 'i', 60000, '', 'sync test')").Scan(&token); err != nil {
			t.Fatal(err)
		}
		if c.successor {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+tg.Prefix+"nodes (scope, instance, node_id, host, pid, endpoint, started_at, last_seen, status, listener_pid) "+
				"VALUES ('sync test', 's', 'n', 'h', 1, '', 0, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'active', pg_backend_pid())"); err != nil {
				t.Fatal(err)
			}
		}
		var granted sql.NullInt64
		if err := q("SELECT fencing_token FROM "+tg.Prefix+"hand_over('sync test', 'h', 'i', $1, 1000, 0)", token).Scan(&granted); err != nil {
			t.Fatal(err)
		}
		var setting string
		if err := q("SHOW synchronous_commit").Scan(&setting); err != nil {
			t.Fatal(err)
		}
		tx.Rollback()
		if granted.Valid != c.successor || setting != c.want {
			t.Errorf("with a successor %v: granted token %v, synchronous_commit %q; want a grant %v, %q", c.successor, granted, setting, c.successor, c.want)
		}
	}
}
