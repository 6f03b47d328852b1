package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// resetDefault forgets the default instance; tests of the package-level
// functions use it because those share process-wide state.
func resetDefault() {
	std.mu.Lock()
	defer std.mu.Unlock()
	std.c.Store(nil)
	std.down.Store(false)
	std.handlers = nil
}

func discover(t *testing.T) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	DiscoveryHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	return rec.Code, body
}

func TestSingleNodeMode(t *testing.T) {
	resetDefault()
	t.Cleanup(resetDefault)
	goroutines := runtime.NumGoroutine()

	if !IsLeader() || FencingToken() != 0 || CurrentNodeID() != "single-node-local" || Endpoint() != "" {
		t.Fatalf("single node: IsLeader %v, FencingToken %d, CurrentNodeID %q, Endpoint %q",
			IsLeader(), FencingToken(), CurrentNodeID(), Endpoint())
	}
	if err := RequireLeader(); err != nil {
		t.Fatalf("RequireLeader = %v", err)
	}
	l, err := CurrentLeader(context.Background())
	if err != nil || l == nil || l.NodeID != SingleNodeID || !l.LeaseExpiresAt.IsZero() || l.FencingToken != 0 {
		t.Fatalf("CurrentLeader = %+v, %v", l, err)
	}
	code, body := discover(t)
	leader, _ := body["leader"].(map[string]any)
	if code != http.StatusOK || leader == nil || leader["nodeId"] != SingleNodeID {
		t.Fatalf("discovery: %d %v", code, body)
	}
	if v, ok := leader["leaseExpiresAt"]; !ok || v != nil {
		t.Fatalf("leaseExpiresAt = %v (present %v), want null", v, ok)
	}
	if self := body["self"].(map[string]any); self["isLeader"] != true || self["nodeId"] != SingleNodeID {
		t.Fatalf("self = %v", self)
	}
	if token, err := FenceToken(context.Background(), nil); token != 0 || err != nil {
		t.Fatalf("FenceToken in single-node mode = %d, %v; want 0, nil without touching a database", token, err)
	}
	OnTransition(func(Event) { t.Error("a transition in single-node mode") })
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Fatalf("single-node mode started %d goroutines", n-goroutines)
	}

	if err := AdvanceTip(context.Background(), nil, "audit", 1, []byte("h")); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("AdvanceTip before Init = %v", err)
	}
	if err := Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if IsLeader() {
		t.Fatal("IsLeader after Shutdown")
	}
	if err := RequireLeader(); !errors.Is(err, ErrNotLeader) || HTTPStatus(err) != http.StatusServiceUnavailable {
		t.Fatalf("RequireLeader after Shutdown = %v", err)
	}
	if err := Fence(context.Background(), nil); !errors.Is(err, ErrStaleFencingToken) {
		t.Fatalf("Fence after Shutdown = %v", err)
	}
	if code, body := discover(t); code != http.StatusServiceUnavailable || body["leader"] != nil {
		t.Fatalf("discovery after Shutdown: %d %v", code, body)
	}
	if err := Init(context.Background(), Config{NodeID: "n", Provider: &stubProvider{}}); !errors.Is(err, ErrAlreadyInitialized) {
		t.Fatalf("Init after Shutdown = %v, want ErrAlreadyInitialized", err)
	}
	if err := Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown = %v", err)
	}
}

func TestInitDefaultInstance(t *testing.T) {
	resetDefault()
	t.Cleanup(resetDefault)
	events := make(chan Event, 4)
	OnTransition(func(e Event) {
		if e.Kind != EventLeaderChanged {
			events <- e
		}
	})

	bad := Config{NodeID: ""}
	if err := Init(context.Background(), bad); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Init(bad) = %v", err)
	}
	cfg := Config{NodeID: "n1", Endpoint: "https://n1.internal", Provider: &stubProvider{},
		LeaseTTL: time.Second, HeartbeatInterval: 100 * time.Millisecond}
	if err := Init(context.Background(), cfg); err != nil {
		t.Fatalf("Init after a failed Init: %v", err)
	}
	if err := Init(context.Background(), cfg); !errors.Is(err, ErrAlreadyInitialized) {
		t.Fatalf("second Init = %v", err)
	}
	if !IsLeader() || FencingToken() != 1 || CurrentNodeID() != "n1" || Endpoint() != "https://n1.internal" || RequireLeader() != nil {
		t.Fatalf("after Init: IsLeader %v, FencingToken %d, CurrentNodeID %q, Endpoint %q",
			IsLeader(), FencingToken(), CurrentNodeID(), Endpoint())
	}
	if e := <-events; e.Kind != EventLeaseAcquired || e.FencingToken != 1 || e.NodeID != "n1" {
		t.Fatalf("handler registered before Init got %+v", e)
	}
	if l, err := CurrentLeader(context.Background()); err != nil || l.NodeID != "n1" {
		t.Fatalf("CurrentLeader = %+v, %v", l, err)
	}
	if err := Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if IsLeader() || FencingToken() != 0 {
		t.Fatal("still leader after Shutdown")
	}
	if e := <-events; e.Kind != EventLeaseReleased || e.Reason != ReasonShutdown {
		t.Fatalf("after Shutdown got %+v", e)
	}
}

// stubProvider grants every acquisition with token 1 and reports the
// holder as leader.
type stubProvider struct{ holder atomic.Value }

func (p *stubProvider) Acquire(_ context.Context, r LeaseRequest) (Lease, error) {
	p.holder.Store(r.Holder)
	return Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: 1}, nil
}
func (p *stubProvider) Renew(_ context.Context, l Lease, _ time.Duration) (Lease, error) {
	return l, nil
}
func (p *stubProvider) Release(context.Context, Lease) error { return nil }
func (p *stubProvider) Leader(context.Context, string) (*Leader, error) {
	h, _ := p.holder.Load().(string)
	return &Leader{NodeID: h, FencingToken: 1}, nil
}
