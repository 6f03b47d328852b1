package cluster_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// The package-level functions share one process-wide default instance, so
// these tests do not run in parallel with each other; each starts from a
// fresh instance through useDefault.

func discover(t *testing.T) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	cluster.DiscoveryHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	return rec.Code, body
}

func TestSingleNodeMode(t *testing.T) {
	useDefault(t)
	goroutines := runtime.NumGoroutine()

	if !cluster.IsLeader() || cluster.FencingToken() != 0 || cluster.Default().NodeID() != "single-node-local" || cluster.Default().Endpoint() != "" {
		t.Fatalf("single node: IsLeader %v, FencingToken %d, CurrentNodeID %q, Endpoint %q",
			cluster.IsLeader(), cluster.FencingToken(), cluster.Default().NodeID(), cluster.Default().Endpoint())
	}
	if err := cluster.RequireLeader(); err != nil {
		t.Fatalf("RequireLeader = %v", err)
	}
	l, err := cluster.Default().CurrentLeader(context.Background())
	if err != nil || l == nil || l.NodeID != cluster.SingleNodeID || !l.LeaseExpiresAt.IsZero() || l.FencingToken != 0 {
		t.Fatalf("CurrentLeader = %+v, %v", l, err)
	}
	code, body := discover(t)
	leader, _ := body["leader"].(map[string]any)
	if code != http.StatusOK || leader == nil || leader["nodeId"] != cluster.SingleNodeID {
		t.Fatalf("discovery: %d %v", code, body)
	}
	if v, ok := leader["leaseExpiresAt"]; !ok || v != nil {
		t.Fatalf("leaseExpiresAt = %v (present %v), want null", v, ok)
	}
	if self := body["self"].(map[string]any); self["isLeader"] != true || self["nodeId"] != cluster.SingleNodeID {
		t.Fatalf("self = %v", self)
	}
	if token, err := cluster.Default().Fence(context.Background(), untouchedTx{}); token != 0 || err != nil {
		t.Fatalf("Fence in single-node mode = %d, %v; want 0, nil without touching a database", token, err)
	}
	singleEvents := make(chan cluster.Event, 1)
	cluster.Default().Notify(singleEvents)
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Fatalf("single-node mode started %d goroutines", n-goroutines)
	}

	if err := cluster.Default().AdvanceTip(context.Background(), untouchedTx{}, "audit", 1, []byte("h")); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("AdvanceTip before Init = %v", err)
	}
	// A missing transaction is refused in every state, as by a member.
	if _, err := cluster.Default().Fence(context.Background(), (*sql.Tx)(nil)); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("Fence(nil *sql.Tx) in single-node mode = %v, want ErrInvalidConfig", err)
	}
	if cluster.Default() != cluster.Default() {
		t.Fatal("Default returned two different *Cluster")
	}
	if st := cluster.Default().Stats(); !st.Leader || st.FencingToken != 0 {
		t.Fatalf("Stats in single-node mode = %+v, want the leader with token 0", st)
	}
	if err := cluster.Default().Resign(context.Background()); err != nil {
		t.Fatalf("Resign in single-node mode = %v, want nil", err)
	}
	if err := cluster.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkShutDown(t)
	// Shut down without Init, the process was never a member.
	if cluster.Default().Clustered() {
		t.Fatal("Clustered after Shutdown without Init = true; the process was never a member")
	}
	if st := cluster.Default().Stats(); st.Leader {
		t.Fatalf("Stats after Shutdown = %+v, want not the leader", st)
	}
	if err := cluster.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown = %v", err)
	}
	if n := len(singleEvents); n != 0 {
		t.Fatalf("%d events in single-node mode, want none", n)
	}
}

// checkShutDown fails the test unless every package-level function reports
// the default instance shut down, for good.
func checkShutDown(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if cluster.IsLeader() || cluster.FencingToken() != 0 {
		t.Fatalf("after Shutdown: IsLeader %v, FencingToken %d", cluster.IsLeader(), cluster.FencingToken())
	}
	if err := cluster.RequireLeader(); !errors.Is(err, cluster.ErrNotLeader) || cluster.HTTPStatus(err) != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "shut down") {
		t.Fatalf("RequireLeader after Shutdown = %v", err)
	}
	if _, err := cluster.Default().Fence(ctx, untouchedTx{}); !errors.Is(err, cluster.ErrStaleFencingToken) || !strings.Contains(err.Error(), "shut down") {
		t.Fatalf("Fence after Shutdown = %v", err)
	}
	if err := cluster.Default().AdvanceTip(ctx, untouchedTx{}, "audit", 1, []byte("h")); !errors.Is(err, cluster.ErrStaleFencingToken) {
		t.Fatalf("AdvanceTip after Shutdown = %v", err)
	}
	if _, err := cluster.Default().CurrentLeader(ctx); !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("CurrentLeader after Shutdown = %v", err)
	}
	if code, body := discover(t); code != http.StatusServiceUnavailable || body["leader"] != nil || body["error"] != "shut down" {
		t.Fatalf("discovery after Shutdown: %d %v", code, body)
	}
	if err := cluster.Init(ctx, cluster.Config{NodeID: "n", Provider: &fakeProvider{}}); !errors.Is(err, cluster.ErrAlreadyInitialized) {
		t.Fatalf("Init after Shutdown = %v, want ErrAlreadyInitialized", err)
	}
}

func TestInitDefaultInstance(t *testing.T) {
	useDefault(t)
	events := make(chan cluster.Event, 4)
	cluster.Default().Notify(receive(t, func(e cluster.Event) {
		if e.Kind != cluster.EventLeaderChanged {
			events <- e
		}
	}))

	bad := cluster.Config{NodeID: ""}
	if err := cluster.Init(context.Background(), bad); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("Init(bad) = %v", err)
	}
	cfg := fakeConfig(t, "n1", leaderProvider())
	cfg.Endpoint = "https://n1.internal"
	if err := cluster.Init(context.Background(), cfg); err != nil {
		t.Fatalf("Init after a failed Init: %v", err)
	}
	if err := cluster.Init(context.Background(), cfg); !errors.Is(err, cluster.ErrAlreadyInitialized) {
		t.Fatalf("second Init = %v", err)
	}
	if !cluster.IsLeader() || cluster.FencingToken() != 1 || cluster.Default().NodeID() != "n1" || cluster.Default().Endpoint() != "https://n1.internal" || cluster.RequireLeader() != nil {
		t.Fatalf("after Init: IsLeader %v, FencingToken %d, CurrentNodeID %q, Endpoint %q",
			cluster.IsLeader(), cluster.FencingToken(), cluster.Default().NodeID(), cluster.Default().Endpoint())
	}
	if e := <-events; e.Kind != cluster.EventLeaseAcquired || e.FencingToken != 1 || e.NodeID != "n1" {
		t.Fatalf("handler registered before Init got %+v", e)
	}
	if l, err := cluster.Default().CurrentLeader(context.Background()); err != nil || l.NodeID != "n1" {
		t.Fatalf("CurrentLeader = %+v, %v", l, err)
	}
	if err := cluster.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e := <-events; e.Kind != cluster.EventLeaseReleased || e.Reason != cluster.ReasonShutdown {
		t.Fatalf("after Shutdown got %+v", e)
	}
	checkShutDown(t)
}

// A failed Init fails closed: nothing says this process leads, the errors
// carry the cause, and discovery answers 503 without the database's words.
// A retried Init that succeeds then leads.
func TestFailedInitFailsClosed(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		useDefault(t)
		ctx := context.Background()
		db := tg.Open(t)
		undo := newerSchema(t, tg, db)
		events := make(chan cluster.Event, 8)
		cluster.Default().Notify(receive(t, func(e cluster.Event) {
			if e.Kind != cluster.EventLeaderChanged {
				events <- e
			}
		}))

		cfg := tg.Config(t, db, "n1")
		initErr := cluster.Init(ctx, cfg)
		if !errors.Is(initErr, cluster.ErrSchema) {
			t.Fatalf("Init over a newer schema = %v, want ErrSchema", initErr)
		}
		if cluster.IsLeader() || cluster.FencingToken() != 0 {
			t.Fatalf("after a failed Init: IsLeader %v, FencingToken %d", cluster.IsLeader(), cluster.FencingToken())
		}
		if id := cluster.Default().NodeID(); id != "n1" {
			t.Errorf("CurrentNodeID after a failed Init = %q, want the configured n1", id)
		}
		if ep := cluster.Default().Endpoint(); ep != "" {
			t.Errorf("Endpoint after a failed Init = %q, want none", ep)
		}
		wraps := func(what string, err error, sentinels ...error) {
			t.Helper()
			for _, s := range append(sentinels, cluster.ErrSchema) {
				if !errors.Is(err, s) {
					t.Errorf("%s = %v; does not wrap %v", what, err, s)
				}
			}
			if err == nil || !strings.Contains(err.Error(), "999") {
				t.Errorf("%s = %v; does not show the cause", what, err)
			}
		}
		err := cluster.RequireLeader()
		wraps("RequireLeader", err, cluster.ErrNotLeader)
		if cluster.HTTPStatus(err) != http.StatusServiceUnavailable {
			t.Errorf("RequireLeader's status = %d, want 503", cluster.HTTPStatus(err))
		}
		token, err := cluster.Default().Fence(ctx, db)
		wraps("Fence", err, cluster.ErrStaleFencingToken, cluster.ErrNotLeader)
		if token != 0 {
			t.Errorf("Fence = %d", token)
		}
		tx, token, err := cluster.Default().BeginFenced(ctx, db, nil)
		wraps("BeginFenced", err, cluster.ErrStaleFencingToken, cluster.ErrNotLeader)
		if tx != nil || token != 0 {
			t.Errorf("BeginFenced = %v, %d; want no transaction", tx, token)
		}
		wraps("AdvanceTip", cluster.Default().AdvanceTip(ctx, db, "audit", 1, []byte("h")), cluster.ErrStaleFencingToken)
		l, err := cluster.Default().CurrentLeader(ctx)
		wraps("CurrentLeader", err)
		if l != nil {
			t.Errorf("CurrentLeader = %+v", l)
		}
		code, body := discover(t)
		if code != http.StatusServiceUnavailable || body["leader"] != nil || body["error"] != "initialization failed" {
			t.Errorf("discovery after a failed Init: %d %v", code, body)
		}
		if self, _ := body["self"].(map[string]any); self["isLeader"] != false || self["nodeId"] != "n1" {
			t.Errorf("discovery self after a failed Init: %v", body["self"])
		}
		if raw, _ := json.Marshal(body); strings.Contains(string(raw), "999") || strings.Contains(string(raw), "schema") {
			t.Errorf("discovery shows the cause: %s", raw)
		}

		// The retry leads, with the handler registered before the first Init.
		undo()
		if err := cluster.Init(ctx, cfg); err != nil {
			t.Fatalf("retried Init: %v", err)
		}
		if !cluster.IsLeader() || cluster.FencingToken() == 0 || cluster.RequireLeader() != nil {
			t.Fatalf("after the retried Init: IsLeader %v, FencingToken %d, RequireLeader %v",
				cluster.IsLeader(), cluster.FencingToken(), cluster.RequireLeader())
		}
		tx, err = db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token, err := cluster.Default().Fence(ctx, tx); err != nil || token != cluster.FencingToken() {
			t.Fatalf("Fence after the retried Init = %d, %v", token, err)
		}
		tx.Rollback()
		tx, token, err = cluster.Default().BeginFenced(ctx, db, nil)
		if err != nil || token != cluster.FencingToken() {
			t.Fatalf("BeginFenced after the retried Init = %d, %v", token, err)
		}
		tx.Rollback()
		if code, _ := discover(t); code != http.StatusOK {
			t.Fatalf("discovery after the retried Init: %d", code)
		}
		if e := <-events; e.Kind != cluster.EventLeaseAcquired {
			t.Fatalf("first event = %+v, want lease-acquired", e)
		}
	})
}

// Shutdown after a failed Init ends the default instance for good.
func TestShutdownAfterFailedInit(t *testing.T) {
	useDefault(t)
	unreachable := errors.New("dial tcp 10.0.0.1:5432: connect: connection refused")
	err := cluster.Init(context.Background(), fakeConfig(t, "n1", initFailer{&fakeProvider{}, unreachable}))
	if !errors.Is(err, unreachable) {
		t.Fatalf("Init = %v", err)
	}
	if err := cluster.RequireLeader(); !errors.Is(err, unreachable) || !errors.Is(err, cluster.ErrNotLeader) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("RequireLeader after a failed Init = %v", err)
	}
	if code, body := discover(t); code != http.StatusServiceUnavailable || strings.Contains(body["error"].(string), "refused") {
		t.Fatalf("discovery after a failed Init: %d %v", code, body)
	}
	// An invalid NodeID is not reported as this node's.
	if err := cluster.Init(context.Background(), cluster.Config{NodeID: "bad\n"}); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("Init with a bad NodeID = %v", err)
	}
	if id := cluster.Default().NodeID(); id != cluster.SingleNodeID {
		t.Fatalf("CurrentNodeID after an Init refused for its NodeID = %q", id)
	}
	if cluster.IsLeader() || cluster.RequireLeader() == nil {
		t.Fatal("leads after a failed Init")
	}
	if err := cluster.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkShutDown(t)
}

// The package-level Shutdown may be called by the receiver of events,
// also while Init runs: it never waits for std's lock held across New.
func TestDefaultShutdownFromHandler(t *testing.T) {
	t.Run("lease-acquired of the term Init acquires", func(t *testing.T) {
		useDefault(t)
		book := newLeaseBook()
		h := shutdownOnKind(cluster.EventLeaseAcquired)
		h.call = cluster.Shutdown
		cluster.Default().Notify(receive(t, h.handle))
		err := cluster.Init(context.Background(), fakeConfig(t, "n1", book.provider()))
		checkInitShutDown(t, err)
		if err := h.wait(t); err != nil {
			t.Fatalf("Shutdown from the handler = %v", err)
		}
		if book.held() {
			t.Fatal("the lease was not released")
		}
		checkShutDown(t)
	})

	t.Run("lease-lost after Init", func(t *testing.T) {
		useDefault(t)
		book := newLeaseBook()
		h := shutdownOnKind(cluster.EventLeaseLost)
		h.call = cluster.Shutdown
		cluster.Default().Notify(receive(t, h.handle))
		if err := cluster.Init(context.Background(), fakeConfig(t, "n1", book.provider())); err != nil {
			t.Fatal(err)
		}
		book.take()
		if err := h.wait(t); err != nil {
			t.Fatalf("Shutdown from the handler = %v", err)
		}
		if err := shutdownWithinDefault(t); err != nil {
			t.Fatalf("second Shutdown = %v", err)
		}
		checkShutDown(t)
	})

	// Init fails while the receiver calls Shutdown.
	t.Run("rollback-detected during a failing Init", func(t *testing.T) {
		testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
			useDefault(t)
			ctx := context.Background()
			db, table, a := auditLeader(t, tg, 3)
			a.Shutdown(ctx)
			deleteOnAcquire(t, tg, db, table, 3)
			h := shutdownOnKind(cluster.EventRollbackDetected)
			h.call = cluster.Shutdown
			cluster.Default().Notify(receive(t, h.handle))
			cfg := tg.Config(t, tg.Open(t), "b")
			withAudit(table)(&cfg)
			if err := cluster.Init(ctx, cfg); !errors.Is(err, cluster.ErrRollbackDetected) {
				t.Fatalf("Init = %v, want ErrRollbackDetected", err)
			}
			if err := h.wait(t); err != nil {
				t.Fatalf("Shutdown from the handler = %v", err)
			}
			checkShutDown(t)
			if c := start(t, tg, "c"); !c.IsLeader() {
				t.Fatal("the lease was not released")
			}
		})
	})

	t.Run("vault-key-rotated by Init", func(t *testing.T) {
		testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
			useDefault(t)
			ctx := context.Background()
			a, err := vaultNode(t, tg, "a", 0)
			if err != nil {
				t.Fatal(err)
			}
			a.Shutdown(ctx)
			h := shutdownOnKind(cluster.EventVaultKeyRotated)
			h.call = cluster.Shutdown
			cluster.Default().Notify(receive(t, h.handle))
			cfg := tg.Config(t, tg.Open(t), "b")
			cfg.VaultKeyFingerprint = fpOf(t, 1)
			cfg.AcceptVaultKeyRotation = true
			checkInitShutDown(t, cluster.Init(ctx, cfg))
			if err := h.wait(t); err != nil {
				t.Fatalf("Shutdown from the handler = %v", err)
			}
			checkShutDown(t)
			if c, err := vaultNode(t, tg, "c", 1); err != nil || !c.IsLeader() {
				t.Fatalf("after Shutdown during Init: New = %v, leads %v; want the lease released", err, c != nil && c.IsLeader())
			}
		})
	})
}

// A Shutdown from another goroutine while Init runs waits for Init to shut
// down what it created.
func TestDefaultShutdownDuringInit(t *testing.T) {
	useDefault(t)
	book := newLeaseBook()
	p := book.provider()
	acquiring := make(chan struct{})
	proceed := make(chan struct{})
	var first sync.Once
	acquire := p.AcquireFunc
	p.AcquireFunc = func(ctx context.Context, r provider.LeaseRequest) (provider.Lease, error) {
		first.Do(func() {
			close(acquiring)
			<-proceed
		})
		return acquire(ctx, r)
	}
	initErr := make(chan error, 1)
	go func() { initErr <- cluster.Init(context.Background(), fakeConfig(t, "n1", p)) }()
	<-acquiring
	if cluster.IsLeader() || cluster.RequireLeader() == nil {
		t.Fatal("leads while Init runs")
	}
	shut := make(chan error, 1)
	go func() { shut <- shutdownWithinDefault(t) }()
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) while Init ran", err)
	case <-time.After(50 * time.Millisecond):
	}
	// Shutdown has been called: the acquisition it lets through must
	// not make this process lead, not even until Init returns.
	var sawLeader atomic.Bool
	watched := make(chan struct{})
	stopWatch := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stopWatch:
				return
			default:
			}
			if cluster.IsLeader() || cluster.Default().IsLeader() {
				sawLeader.Store(true)
			}
			runtime.Gosched()
		}
	}()
	close(proceed)
	err := <-initErr
	close(stopWatch)
	<-watched
	if !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("Init = %v, want ErrShutdown", err)
	}
	if sawLeader.Load() {
		t.Fatal("IsLeader was true after Shutdown was called, while Init finished")
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown = %v", err)
	}
	if book.held() {
		t.Fatal("the lease Init acquired was not released")
	}
	checkShutDown(t)
}

// checkInitShutDown checks the result of an Init whose first events have
// a handler that calls Shutdown. The handlers run on their own goroutine,
// so Init may return before the handler calls Shutdown (nil), or after
// (an error wrapping ErrShutdown). Either way Shutdown ends what Init
// created; the caller checks that.
func checkInitShutDown(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("Init = %v, want nil or ErrShutdown", err)
	}
	t.Logf("Init = %v", err)
}

// The package-level RunWhileLeader runs the work once in single-node mode
// (token 0) until Init, which ends it and waits for it before
// campaigning; it does not run while Init fails; it runs in the member's
// terms once Init succeeds; Shutdown stops it before releasing.
func TestDefaultRunWhileLeader(t *testing.T) {
	useDefault(t)
	ctx := context.Background()
	type run struct {
		token   uint64
		stopped chan struct{}
	}
	runs := make(chan run, 4)
	done := make(chan error, 1)
	go func() {
		done <- cluster.Default().RunWhileLeader(ctx, func(ctx context.Context, token uint64) error {
			r := run{token, make(chan struct{})}
			runs <- r
			<-ctx.Done()
			time.Sleep(50 * time.Millisecond) // a sleep: work that takes a while to stop, which Init and Shutdown wait for
			close(r.stopped)
			return nil
		})
	}()
	single := <-runs
	if single.token != 0 {
		t.Fatalf("single-node work got token %d, want 0", single.token)
	}

	// A failing Init ends single-node work, after waiting for it, and
	// none runs while nothing leads.
	failing := fakeConfig(t, "n1", &fakeProvider{AcquireFunc: func(context.Context, provider.LeaseRequest) (provider.Lease, error) {
		return provider.Lease{}, errors.New("unreachable")
	}})
	failing.Provider = initFailer{failing.Provider, errors.New("database unreachable")}
	if err := cluster.Init(ctx, failing); err == nil {
		t.Fatal("Init with a failing provider succeeded")
	}
	select {
	case <-single.stopped:
	default:
		t.Fatal("Init returned before single-node work stopped")
	}
	select {
	case r := <-runs:
		t.Fatalf("work ran with token %d after a failed Init", r.token)
	case <-time.After(200 * time.Millisecond):
	}

	// A successful Init: the work runs in the member's term.
	if err := cluster.Init(ctx, fakeConfig(t, "n1", leaderProvider())); err != nil {
		t.Fatal(err)
	}
	member := <-runs
	if member.token != 1 {
		t.Fatalf("work after Init got token %d, want 1", member.token)
	}
	if err := cluster.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-member.stopped:
	default:
		t.Fatal("Shutdown returned before the work stopped")
	}
	if err := <-done; !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("RunWhileLeader after Shutdown = %v, want ErrShutdown", err)
	}
	if err := cluster.Default().Resign(ctx); !errors.Is(err, cluster.ErrShutdown) || !errors.Is(err, cluster.ErrNotLeader) {
		t.Fatalf("Resign after Shutdown = %v", err)
	}
}

// The package-level lane and config-version calls: in single-node mode
// this process owns every lane and claims without a database; after a
// failed Init they fail closed, as Fence does; once Init succeeds they
// answer for the member; after Shutdown they fail with ErrShutdown.
func TestDefaultLanes(t *testing.T) {
	useDefault(t)
	ctx := context.Background()
	goroutines := runtime.NumGoroutine()

	// Single-node mode: no database, no goroutine.
	if cluster.Default().Clustered() {
		t.Fatal("Clustered before Init")
	}
	if l, err := cluster.Default().LaneOwner(ctx, "orders-1"); err != nil || l == nil || l.Key != "orders-1" || l.Holder != cluster.SingleNodeID ||
		l.FencingToken != 0 || !l.ExpiresAt.IsZero() {
		t.Fatalf("LaneOwner in single-node mode = %+v, %v; want this node, token 0, no expiry", l, err)
	}
	if _, err := cluster.Default().LaneOwner(ctx, ""); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("LaneOwner of an empty key = %v", err)
	}
	if !cluster.Default().OwnsLane("orders-1") || cluster.Default().Lanes() != nil {
		t.Fatalf("single node: OwnsLane %v, Lanes %v", cluster.Default().OwnsLane("orders-1"), cluster.Default().Lanes())
	}
	if token, err := cluster.Default().ClaimLane(ctx, untouchedTx{}, "orders-1"); token != 0 || err != nil {
		t.Fatalf("ClaimLane in single-node mode = %d, %v; want 0, nil without touching a database", token, err)
	}
	if _, err := cluster.Default().ClaimLane(ctx, untouchedTx{}, ""); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("ClaimLane of an empty key = %v", err)
	}
	if err := cluster.Default().ReleaseLane(ctx, "orders-1"); err != nil {
		t.Fatal(err)
	}
	if v, err := cluster.Default().ConfigVersion(ctx); v != 0 || err != nil {
		t.Fatalf("ConfigVersion in single-node mode = %d, %v", v, err)
	}
	if v, err := cluster.Default().BumpConfigVersion(ctx); v != 0 || err != nil || cluster.Default().ConfigVersionCached() != 0 {
		t.Fatalf("BumpConfigVersion in single-node mode = %d, %v; cached %d; want 0 and nothing bumped", v, err, cluster.Default().ConfigVersionCached())
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Fatalf("single-node lanes started %d goroutines", n-goroutines)
	}

	// A failed Init fails closed.
	if err := cluster.Init(ctx, fakeConfig(t, "n", initFailer{&fakeProvider{}, errors.New("database unreachable")})); err == nil {
		t.Fatal("Init over a failing provider succeeded")
	}
	if cluster.Default().OwnsLane("orders-1") {
		t.Fatal("OwnsLane after a failed Init")
	}
	if !cluster.Default().Clustered() {
		t.Fatal("not Clustered after a failed Init: the process left single-node mode when Init was called")
	}
	if l, err := cluster.Default().LaneOwner(ctx, "orders-1"); l != nil || err == nil || !strings.Contains(err.Error(), "database unreachable") {
		t.Fatalf("LaneOwner after a failed Init = %+v, %v", l, err)
	}
	if _, err := cluster.Default().ClaimLane(ctx, untouchedTx{}, "orders-1"); !errors.Is(err, cluster.ErrStaleFencingToken) || !strings.Contains(err.Error(), "database unreachable") {
		t.Fatalf("ClaimLane after a failed Init = %v, want ErrStaleFencingToken with Init's error", err)
	}
	if _, err := cluster.Default().ConfigVersion(ctx); err == nil || !strings.Contains(err.Error(), "database unreachable") {
		t.Fatalf("ConfigVersion after a failed Init = %v", err)
	}
	if _, err := cluster.Default().BumpConfigVersion(ctx); err == nil {
		t.Fatal("BumpConfigVersion after a failed Init succeeded")
	}

	// Running: the member answers.
	tg := testdb.New(t, cluster.SQLite)
	db := tg.Open(t)
	if err := cluster.Init(ctx, tg.Config(t, db, "n")); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	token, err := cluster.Default().ClaimLane(ctx, tx, "orders-1")
	if err != nil || token != 1 {
		t.Fatalf("ClaimLane = %d, %v; want token 1", token, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if !cluster.Default().OwnsLane("orders-1") || cluster.Default().OwnsLane("orders-2") || !slices.Equal(cluster.Default().Lanes(), []string{"orders-1"}) {
		t.Fatalf("OwnsLane %v/%v, Lanes %v", cluster.Default().OwnsLane("orders-1"), cluster.Default().OwnsLane("orders-2"), cluster.Default().Lanes())
	}
	if l, err := cluster.Default().LaneOwner(ctx, "orders-1"); err != nil || l == nil || l.Holder != "n" || l.FencingToken != token || l.Remaining <= 0 {
		t.Fatalf("LaneOwner = %+v, %v; want n with token %d", l, err, token)
	}
	if l, err := cluster.Default().LaneOwner(ctx, "orders-2"); l != nil || err != nil {
		t.Fatalf("LaneOwner of a lane never claimed = %+v, %v; want nil, nil", l, err)
	}
	if !cluster.Default().Clustered() {
		t.Fatal("not Clustered while running")
	}
	if v, err := cluster.Default().BumpConfigVersion(ctx); v != 1 || err != nil || cluster.Default().ConfigVersionCached() != 1 {
		t.Fatalf("BumpConfigVersion = %d, %v; cached %d", v, err, cluster.Default().ConfigVersionCached())
	}
	if v, err := cluster.Default().ConfigVersion(ctx); v != 1 || err != nil {
		t.Fatalf("ConfigVersion = %d, %v", v, err)
	}

	// Shut down.
	if err := cluster.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Default().ClaimLane(ctx, untouchedTx{}, "orders-1"); !errors.Is(err, cluster.ErrShutdown) || !errors.Is(err, cluster.ErrStaleFencingToken) {
		t.Fatalf("ClaimLane after Shutdown = %v", err)
	}
	if cluster.Default().OwnsLane("orders-1") || cluster.Default().Lanes() != nil {
		t.Fatal("lanes owned after Shutdown")
	}
	if _, err := cluster.Default().LaneOwner(ctx, "orders-1"); !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("LaneOwner after Shutdown = %v", err)
	}
	if !cluster.Default().Clustered() {
		t.Fatal("not Clustered after Shutdown")
	}
	if err := cluster.Default().ReleaseLane(ctx, "orders-1"); !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("ReleaseLane after Shutdown = %v", err)
	}
	if _, err := cluster.Default().ConfigVersion(ctx); !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("ConfigVersion after Shutdown = %v", err)
	}
	if _, err := cluster.Default().BumpConfigVersion(ctx); !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("BumpConfigVersion after Shutdown = %v", err)
	}
	if got := cluster.Default().ConfigVersionCached(); got != 1 {
		t.Fatalf("ConfigVersionCached after Shutdown = %d, want the last version seen, 1", got)
	}
}
