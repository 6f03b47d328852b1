package providertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/provider"
)

// A Tx is a transaction of the store under test, in which [RunLanes]
// claims lanes.
type Tx interface {
	provider.Querier
	cluster.Tx
	Commit() error
	Rollback() error
}

// SQLTx adapts a database/sql transaction to a [Tx].
func SQLTx(tx *sql.Tx) Tx { return sqlTx{tx} }

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, query, args...)
}

func (t sqlTx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t sqlTx) QueryRow(ctx context.Context, query string, args ...any) provider.Row {
	return t.tx.QueryRowContext(ctx, query, args...)
}

func (t sqlTx) Commit() error   { return t.tx.Commit() }
func (t sqlTx) Rollback() error { return t.tx.Rollback() }

// NoTx is the Tx of a store without transactions, such as [Memory]: it
// runs no statement, and Commit and Rollback do nothing.
var NoTx Tx = noTx{}

type noTx struct{}

var errNoTx = errors.New("providertest: NoTx runs no statement")

func (noTx) Exec(context.Context, string, ...any) (int64, error) { return 0, errNoTx }
func (noTx) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, errNoTx
}
func (noTx) QueryRow(context.Context, string, ...any) provider.Row {
	return noRow{}
}
func (noTx) Commit() error   { return nil }
func (noTx) Rollback() error { return nil }

type noRow struct{}

func (noRow) Scan(...any) error { return errNoTx }

// A LaneTarget is a fresh store for [RunLanes].
type LaneTarget struct {
	// Open returns one more provider over the store, as one more node
	// would have: what one claims, the others see.
	Open func() provider.LaneStore
	// Begin begins a transaction on the store, in which the suite calls
	// PeekLane and ClaimLane; the suite commits or rolls back each one.
	// A store without transactions returns [NoTx].
	Begin func(ctx context.Context) (Tx, error)
}

// The lane holders the suite claims as: holder, instance.
var laneNodes = map[string]string{"a": "a-instance", "b": "b-instance"}

func laneReq(holder, key string, ttl time.Duration) provider.LaneRequest {
	return provider.LaneRequest{Scope: "leader", Key: key, Holder: holder, Instance: laneNodes[holder], TTL: ttl}
}

// RunLanes runs the conformance suite of [provider.LaneStore] (and of
// [provider.ConfigStore], when the store implements it) as subtests of t;
// see the package doc. newStore is called once at the start of each
// subtest and must return a fresh, empty store, as for [Run].
func RunLanes(t *testing.T, newStore func(t *testing.T) LaneTarget) {
	t.Run("ClaimFree", func(t *testing.T) {
		s := newStore(t)
		a, b := s.Open(), s.Open()
		l := claim(t, s, a, laneReq("a", "k", ttl))
		if l.Key != "k" || l.Holder != "a" || l.Instance != "a-instance" || l.FencingToken == 0 ||
			l.Remaining <= 0 || l.Remaining > ttl || !l.ExpiresAt.After(l.AcquiredAt) {
			t.Fatalf("claim = %+v; want lane k held by a, a-instance, with a nonzero token and at most %v left", l, ttl)
		}
		mustHoldLane(t, b, "k", "a", l.FencingToken)
	})

	t.Run("NeverClaimed", func(t *testing.T) {
		s := newStore(t)
		a := s.Open()
		if l, err := a.ReadLane(t.Context(), "leader", "k"); l != nil || err != nil {
			t.Fatalf("ReadLane of a lane never claimed = %+v, %v; want nil, nil", l, err)
		}
		l, c, err := peek(t, s, a, laneReq("a", "k", ttl))
		if l != nil || err != nil || !reflect.DeepEqual(c, provider.LaneCensus{}) {
			t.Fatalf("PeekLane of an empty store = %+v, %+v, %v; want nil, a zero census, nil", l, c, err)
		}
	})

	t.Run("ClaimHeld", func(t *testing.T) {
		s := newStore(t)
		a, b := s.Open(), s.Open()
		l := claim(t, s, a, laneReq("a", "k", ttl))
		_, err := tryClaim(t, s, b, laneReq("b", "k", ttl))
		var held *cluster.LaneHeldError
		if !errors.Is(err, cluster.ErrLaneHeld) || !errors.As(err, &held) {
			t.Fatalf("claim of a held lane = %v, want a *LaneHeldError matching ErrLaneHeld", err)
		}
		if held.Lane != "k" || held.Holder != "a" || held.Instance != "a-instance" || held.FencingToken != l.FencingToken ||
			held.Remaining <= 0 || held.Remaining > ttl {
			t.Fatalf("LaneHeldError = %+v; want lane k, a, a-instance, token %d, within (0, %v] left", held, l.FencingToken, ttl)
		}
		mustHoldLane(t, b, "k", "a", l.FencingToken)
	})

	t.Run("ClaimRenews", func(t *testing.T) {
		s := newStore(t)
		a := s.Open()
		l := claim(t, s, a, laneReq("a", "k", ttl))
		r := claim(t, s, a, laneReq("a", "k", 2*ttl))
		if r.FencingToken != l.FencingToken || r.Holder != "a" || r.Instance != "a-instance" || r.Remaining <= ttl {
			t.Fatalf("renewal by the holder = %+v; want token %d kept and more than %v left", r, l.FencingToken, ttl)
		}
	})

	t.Run("ReleaseThenClaim", func(t *testing.T) {
		ctx := t.Context()
		s := newStore(t)
		a, b := s.Open(), s.Open()
		if err := a.ReleaseLane(ctx, "leader", "k", "a", "a-instance"); err != nil {
			t.Fatalf("ReleaseLane of a lane never claimed = %v, want nil", err)
		}
		l := claim(t, s, a, laneReq("a", "k", ttl))
		for _, w := range [][3]string{{"other", "a", "a-instance"}, {"k", "b", "a-instance"}, {"k", "a", "b-instance"}} {
			if err := b.ReleaseLane(ctx, "leader", w[0], w[1], w[2]); err != nil {
				t.Fatalf("ReleaseLane(%q, %q, %q) = %v, want nil", w[0], w[1], w[2], err)
			}
		}
		mustHoldLane(t, b, "k", "a", l.FencingToken) // released by none of them
		if err := a.ReleaseLane(ctx, "leader", "k", "a", "a-instance"); err != nil {
			t.Fatal(err)
		}
		mustBeFreeLane(t, b, "k", l.FencingToken)
		if err := a.ReleaseLane(ctx, "leader", "k", "a", "a-instance"); err != nil {
			t.Fatalf("second ReleaseLane = %v, want nil", err)
		}
		n := claim(t, s, b, laneReq("b", "k", ttl))
		if n.FencingToken <= l.FencingToken || n.Holder != "b" {
			t.Fatalf("claim after the release = %+v; want b with a token above %d", n, l.FencingToken)
		}
	})

	t.Run("TokensIncrease", func(t *testing.T) {
		ctx := t.Context()
		s := newStore(t)
		p := map[string]provider.LaneStore{"a": s.Open(), "b": s.Open()}
		var last uint64
		for i := range 10 {
			h := []string{"a", "b"}[i%2]
			l := claim(t, s, p[h], laneReq(h, "k", ttl))
			if l.FencingToken <= last {
				t.Fatalf("claim %d got token %d after %d", i, l.FencingToken, last)
			}
			last = l.FencingToken
			if err := p[h].ReleaseLane(ctx, "leader", "k", h, laneNodes[h]); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("Expiry", func(t *testing.T) {
		ctx := t.Context()
		s := newStore(t)
		a, b := s.Open(), s.Open()
		l := claim(t, s, a, laneReq("a", "k", shortTTL))
		time.Sleep(l.Remaining + expiryMargin)
		mustBeFreeLane(t, b, "k", l.FencingToken)
		rep, err := a.RenewLanes(ctx, "leader", "a-instance", ttl, ttl)
		if err != nil || len(rep.Held) != 0 {
			t.Fatalf("RenewLanes after the lane expired = %+v, %v; want no lane renewed", rep, err)
		}
		mustBeFreeLane(t, b, "k", l.FencingToken)
		n := claim(t, s, b, laneReq("b", "k", ttl))
		if n.FencingToken <= l.FencingToken {
			t.Fatalf("claim after expiry got token %d, want above %d", n.FencingToken, l.FencingToken)
		}
		if _, err := tryClaim(t, s, a, laneReq("a", "k", ttl)); !errors.Is(err, cluster.ErrLaneHeld) {
			t.Fatalf("claim by the expired holder = %v, want ErrLaneHeld", err)
		}
	})

	t.Run("RenewLanes", func(t *testing.T) {
		ctx := t.Context()
		s := newStore(t)
		a, b := s.Open(), s.Open()
		k1 := claim(t, s, a, laneReq("a", "k1", ttl))
		k2 := claim(t, s, a, laneReq("a", "k2", ttl))
		claim(t, s, b, laneReq("b", "k3", ttl))
		rep, err := a.RenewLanes(ctx, "leader", "a-instance", 2*ttl, ttl)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(rep.Held, func(x, y cluster.Lane) int { return strings.Compare(x.Key, y.Key) })
		if len(rep.Held) != 2 || rep.Held[0].Key != "k1" || rep.Held[0].FencingToken != k1.FencingToken ||
			rep.Held[1].Key != "k2" || rep.Held[1].FencingToken != k2.FencingToken ||
			rep.Held[0].Remaining <= ttl || rep.Held[1].Remaining <= ttl {
			t.Fatalf("RenewLanes reported %+v; want k1 and k2 with their tokens and more than %v left", rep.Held, ttl)
		}
		if rep.Census.Lanes != 3 || rep.Census.Mine != 2 {
			t.Fatalf("RenewLanes census = %+v; want 3 lanes, 2 of them mine", rep.Census)
		}
		if l := readLane(t, b, "k1"); l.Remaining <= ttl {
			t.Fatalf("k1 after RenewLanes for %v: %v left", 2*ttl, l.Remaining)
		}
		if l := readLane(t, a, "k3"); l.Holder != "b" || l.Remaining > ttl {
			t.Fatalf("b's k3 after a's RenewLanes: %+v; want b's, unchanged", l)
		}
	})

	t.Run("ReleaseLanes", func(t *testing.T) {
		ctx := t.Context()
		s := newStore(t)
		a, b := s.Open(), s.Open()
		k1 := claim(t, s, a, laneReq("a", "k1", ttl))
		k2 := claim(t, s, a, laneReq("a", "k2", ttl))
		k3 := claim(t, s, b, laneReq("b", "k3", ttl))
		if err := a.ReleaseLanes(ctx, "leader", "a", "b-instance"); err != nil {
			t.Fatal(err)
		}
		mustHoldLane(t, b, "k1", "a", k1.FencingToken) // not a's instance
		if err := a.ReleaseLanes(ctx, "leader", "a", "a-instance"); err != nil {
			t.Fatal(err)
		}
		mustBeFreeLane(t, b, "k1", k1.FencingToken)
		mustBeFreeLane(t, b, "k2", k2.FencingToken)
		mustHoldLane(t, a, "k3", "b", k3.FencingToken)
	})

	t.Run("IndependentScopes", func(t *testing.T) {
		s := newStore(t)
		a, b := s.Open(), s.Open()
		claim(t, s, a, laneReq("a", "k", ttl))
		other := laneReq("b", "k", ttl)
		other.Scope = "other"
		if l := claim(t, s, b, other); l.Holder != "b" {
			t.Fatalf("claim of the same key in another scope = %+v", l)
		}
		mustHoldLane(t, b, "k", "a", 0)
	})

	t.Run("Census", func(t *testing.T) {
		ctx := t.Context()
		s := newStore(t)
		a, b := s.Open(), s.Open()
		for h, p := range map[string]provider.LaneStore{"a": a, "b": b} {
			if ms, ok := p.(provider.MemberStore); ok {
				if err := ms.Join(ctx, "leader", cluster.Member{NodeID: h, Instance: laneNodes[h], Host: "host", PID: 1}); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.JoinLanes(ctx, "leader", laneNodes[h]); err != nil {
				t.Fatal(err)
			}
		}
		claim(t, s, a, laneReq("a", "k1", ttl))
		claim(t, s, a, laneReq("a", "k2", ttl))
		claim(t, s, b, laneReq("b", "k3", ttl))
		_, c, err := peek(t, s, a, laneReq("a", "k4", ttl))
		loads := c.Loads
		c.Loads = nil
		if err != nil || !reflect.DeepEqual(c, provider.LaneCensus{Lanes: 3, Mine: 2, Members: 1}) {
			t.Fatalf("a's census = %+v, %v; want 3 lanes, 2 of them a's, 1 other member", c, err)
		}
		// Loads are optional; reported, they are right.
		if loads != nil && !slices.Equal(loads, []provider.MemberLoad{{Lanes: 1, Before: false}}) {
			t.Fatalf("a's census loads = %+v; want b's 1 lane, b sorting after a", loads)
		}
		_, c, err = peek(t, s, b, laneReq("b", "k4", ttl))
		if err != nil || (c.Loads != nil && !slices.Equal(c.Loads, []provider.MemberLoad{{Lanes: 2, Before: true}})) {
			t.Fatalf("b's census = %+v, %v; want a's 2 lanes, a sorting before b", c, err)
		}
	})

	t.Run("ConcurrentClaim", func(t *testing.T) {
		ctx := t.Context()
		s := newStore(t)
		const n = 6
		ps := make([]provider.LaneStore, n)
		for i := range ps {
			ps[i] = s.Open()
		}
		// Round 0 claims a lane never claimed before: a store that creates
		// its row in the claim must not fail one claim for the other's.
		var last uint64
		for round := range 3 {
			var wg sync.WaitGroup
			got := make([]cluster.Lane, n)
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() {
					r := provider.LaneRequest{Scope: "leader", Key: "k", Holder: fmt.Sprint("n", i), Instance: fmt.Sprint("n", i, "-instance"), TTL: ttl}
					got[i], errs[i] = tryClaim(t, s, ps[i], r)
				})
			}
			wg.Wait()
			winner := -1
			for i, err := range errs {
				switch {
				case err == nil && winner >= 0:
					t.Fatalf("round %d: claims by n%d and n%d both granted (%+v, %+v)", round, winner, i, got[winner], got[i])
				case err == nil:
					winner = i
				case !errors.Is(err, cluster.ErrLaneHeld):
					t.Fatalf("round %d: claim by n%d = %v, want a grant or ErrLaneHeld", round, i, err)
				}
			}
			if winner < 0 {
				t.Fatalf("round %d: no claim granted", round)
			}
			w := got[winner]
			if w.FencingToken <= last {
				t.Fatalf("round %d: token %d after %d", round, w.FencingToken, last)
			}
			last = w.FencingToken
			mustHoldLane(t, ps[0], "k", w.Holder, w.FencingToken)
			if err := ps[winner].ReleaseLane(ctx, "leader", "k", w.Holder, w.Instance); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("ConfigVersion", func(t *testing.T) {
		ctx := t.Context()
		s := newStore(t)
		a, ok := s.Open().(provider.ConfigStore)
		if !ok {
			t.Skip("the store does not implement cluster.ConfigStore")
		}
		b := s.Open().(provider.ConfigStore)
		if v, err := a.ReadConfigVersion(ctx, "leader"); v != 0 || err != nil {
			t.Fatalf("ReadConfigVersion of a new store = %d, %v; want 0", v, err)
		}
		var wg sync.WaitGroup
		seen := make([]uint64, 10)
		errs := make([]error, 10)
		for i := range seen {
			p := []provider.ConfigStore{a, b}[i%2]
			wg.Go(func() { seen[i], errs[i] = p.BumpConfigVersion(ctx, "leader") })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		slices.Sort(seen)
		for i, v := range seen {
			if v != uint64(i+1) {
				t.Fatalf("10 concurrent bumps returned %v; want each of 1..10 once", seen)
			}
		}
		if v, err := b.ReadConfigVersion(ctx, "leader"); v != 10 || err != nil {
			t.Fatalf("ReadConfigVersion after 10 bumps = %d, %v", v, err)
		}
		if v, err := b.ReadConfigVersion(ctx, "other"); v != 0 || err != nil {
			t.Fatalf("ReadConfigVersion of another scope = %d, %v; want 0", v, err)
		}
	})
}

// tryClaim claims r in a transaction of its own, committed when the claim
// is granted.
func tryClaim(t *testing.T, s LaneTarget, p provider.LaneStore, r provider.LaneRequest) (cluster.Lane, error) {
	t.Helper()
	ctx := t.Context()
	tx, err := s.Begin(ctx)
	if err != nil {
		return cluster.Lane{}, fmt.Errorf("begin: %w", err)
	}
	l, err := p.ClaimLane(ctx, tx, r)
	if err != nil {
		tx.Rollback()
		return l, err
	}
	return l, tx.Commit()
}

func claim(t *testing.T, s LaneTarget, p provider.LaneStore, r provider.LaneRequest) cluster.Lane {
	t.Helper()
	l, err := tryClaim(t, s, p, r)
	if err != nil {
		t.Fatalf("claim of lane %q by %s: %v", r.Key, r.Holder, err)
	}
	return l
}

func peek(t *testing.T, s LaneTarget, p provider.LaneStore, r provider.LaneRequest) (*cluster.Lane, provider.LaneCensus, error) {
	t.Helper()
	tx, err := s.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	return p.PeekLane(t.Context(), tx, r, ttl)
}

func readLane(t *testing.T, p provider.LaneStore, key string) *cluster.Lane {
	t.Helper()
	l, err := p.ReadLane(t.Context(), "leader", key)
	if err != nil || l == nil {
		t.Fatalf("ReadLane(%q) = %+v, %v", key, l, err)
	}
	return l
}

// mustHoldLane checks that holder holds lane key (through its instance,
// for a and b), with token unless it is 0.
func mustHoldLane(t *testing.T, p provider.LaneStore, key, holder string, token uint64) {
	t.Helper()
	l := readLane(t, p, key)
	instance, named := laneNodes[holder]
	if l.Key != key || l.Holder != holder || (named && l.Instance != instance) || (token != 0 && l.FencingToken != token) ||
		l.Remaining <= 0 || l.Remaining > 2*ttl {
		t.Fatalf("ReadLane(%q) = %+v; want it held by %s with token %d", key, l, holder, token)
	}
}

// mustBeFreeLane checks that lane key is free, its token kept.
func mustBeFreeLane(t *testing.T, p provider.LaneStore, key string, token uint64) {
	t.Helper()
	l := readLane(t, p, key)
	if l.Remaining > 0 || l.FencingToken != token {
		t.Fatalf("ReadLane(%q) = %+v; want it free, with token %d kept", key, l, token)
	}
}
