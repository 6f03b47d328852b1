package cluster_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

func TestDiscoveryHandler(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		f := start(t, tg, "f", func(c *cluster.Config) { c.Role = cluster.RoleFollower; c.Endpoint = "" })

		// No leader: 503, leader null. The follower's first lookup needs a
		// new connection, which can outlast its heartbeat-long bound on a
		// loaded machine: that one answers "leader lookup failed"; ask again.
		code, hdr, body, _ := get(t, f.DiscoveryHandler(), http.MethodGet)
		for deadline := time.Now().Add(2 * time.Second); body["error"] == "leader lookup failed" && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			code, hdr, body, _ = get(t, f.DiscoveryHandler(), http.MethodGet)
		}
		if code != http.StatusServiceUnavailable || body["leader"] != nil {
			t.Fatalf("no leader: %d %v", code, body)
		}
		if hdr.Get("Cache-Control") != "no-store" || hdr.Get("Content-Type") != "application/json" {
			t.Fatalf("headers = %v", hdr)
		}
		self := body["self"].(map[string]any)
		if self["nodeId"] != "f" || self["isLeader"] != false || self["endpoint"] != nil {
			t.Fatalf("self = %v", self)
		}
		if _, ok := body["error"]; ok {
			t.Fatalf("no leader is not an error: %v", body)
		}

		// A leader: 200 with its details, from any node, for any method.
		a := start(t, tg, "a")
		waitFor(t, 2*time.Second, "a to lead", a.IsLeader) // its first attempt may meet the follower's write
		for _, n := range []*node{a, f} {
			for _, m := range []string{http.MethodGet, http.MethodPost, "PROPFIND"} {
				code, _, body, _ := get(t, n.DiscoveryHandler(), m)
				leader, _ := body["leader"].(map[string]any)
				if code != http.StatusOK || leader == nil {
					t.Fatalf("%s %s: %d %v", n.NodeID(), m, code, body)
				}
				if leader["nodeId"] != "a" || leader["endpoint"] != a.Endpoint() || leader["fencingToken"] != float64(a.FencingToken()) {
					t.Fatalf("%s: leader = %v", n.NodeID(), leader)
				}
				exp, ok := leader["leaseExpiresAt"].(float64)
				if !ok || exp < float64(time.Now().Add(-time.Minute).UnixMilli()) {
					t.Fatalf("leaseExpiresAt = %v, want unix milliseconds", leader["leaseExpiresAt"])
				}
				if got := body["self"].(map[string]any)["isLeader"]; got != (n == a) {
					t.Fatalf("%s: self.isLeader = %v", n.NodeID(), got)
				}
			}
		}

		// HEAD: same status and headers, no body.
		code, hdr, _, raw := get(t, a.DiscoveryHandler(), http.MethodHead)
		if code != http.StatusOK || raw != "" || hdr.Get("Cache-Control") != "no-store" {
			t.Fatalf("HEAD: %d %q %v", code, raw, hdr)
		}

		// A failed lookup: 503, a fixed message, never the database's own.
		f.db.Close()
		code, _, body, raw = get(t, f.DiscoveryHandler(), http.MethodGet)
		if code != http.StatusServiceUnavailable || body["leader"] != nil || body["error"] != "leader lookup failed" {
			t.Fatalf("failed lookup: %d %v", code, body)
		}
		if strings.Contains(raw, "closed") || strings.Contains(raw, "sql") {
			t.Fatalf("database error leaked to the client: %s", raw)
		}
	})
}

// Concurrent requests share one read of the store.
func TestDiscoveryCoalescesLookups(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	gate := make(chan struct{})
	p := &fakeProvider{
		AcquireFunc: func(context.Context, provider.LeaseRequest) (provider.Lease, error) {
			return provider.Lease{}, &cluster.LeaseHeldError{Holder: "x", Remaining: time.Second}
		},
		LeaderFunc: func(context.Context, string) (*cluster.Leader, error) {
			calls.Add(1)
			<-gate
			return &cluster.Leader{NodeID: "x", FencingToken: 7, LeaseExpiresAt: time.UnixMilli(1)}, nil
		},
	}
	h := startFake(t, p).DiscoveryHandler()
	var wg sync.WaitGroup
	codes := make([]int, 20)
	for i := range codes {
		wg.Go(func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			codes[i] = rec.Code
		})
	}
	waitFor(t, 2*time.Second, "the first lookup", func() bool { return calls.Load() == 1 })
	time.Sleep(50 * time.Millisecond) // let the other requests queue behind it; nothing signals that they have
	close(gate)
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusOK {
			t.Fatalf("request %d: %d", i, code)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("20 concurrent requests made %d reads, want 1", n)
	}
}

// A cancelled request does not spoil the shared read for the others.
func TestDiscoveryCancelledRequest(t *testing.T) {
	t.Parallel()
	p := &fakeProvider{
		AcquireFunc: func(context.Context, provider.LeaseRequest) (provider.Lease, error) {
			return provider.Lease{}, errors.New("down")
		},
		LeaderFunc: func(ctx context.Context, _ string) (*cluster.Leader, error) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
				return &cluster.Leader{NodeID: "x", LeaseExpiresAt: time.UnixMilli(1)}, nil
			}
		},
	}
	c := startFake(t, p)
	// Sleeps pace the requests, as nothing signals a request joining the
	// read: the first starts it, the second joins it 5ms in, and the first
	// is cancelled 10ms in, before the read ends at 50ms.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	var wg sync.WaitGroup
	wg.Go(func() { c.CurrentLeader(ctx) })
	time.Sleep(5 * time.Millisecond)
	l, err := c.CurrentLeader(context.Background())
	wg.Wait()
	if err != nil || l == nil || l.NodeID != "x" {
		t.Fatalf("CurrentLeader = %+v, %v", l, err)
	}
}

// A failing store is logged once as a warning, not once per request.
func TestDiscoveryLogsFailureOnce(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	p := &fakeProvider{LeaderFunc: func(context.Context, string) (*cluster.Leader, error) {
		if failing.Load() {
			return nil, errors.New("connection refused")
		}
		return &cluster.Leader{NodeID: "a"}, nil
	}}
	var mu sync.Mutex
	var logged strings.Builder
	cfg := fakeConfig(t, "a", p)
	cfg.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil))
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	h := c.DiscoveryHandler()
	for range 5 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	}
	failing.Store(false)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	mu.Lock()
	out := logged.String()
	mu.Unlock()
	if n := strings.Count(out, "level=WARN msg=\"cluster: discovery: leader lookup failed\""); n != 1 {
		t.Fatalf("5 failed lookups logged %d warnings, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "leader lookups succeed again") {
		t.Fatalf("recovery not logged:\n%s", out)
	}
}
