package cluster_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// fakeProvider is a Provider whose behaviour each test sets.
type fakeProvider struct {
	AcquireFunc func(context.Context, provider.LeaseRequest) (provider.Lease, error)
	RenewFunc   func(context.Context, provider.Lease, time.Duration) (provider.Lease, error)
	ReleaseFunc func(context.Context, provider.Lease) error
	LeaderFunc  func(context.Context, string) (*cluster.Leader, error)
}

var _ provider.Provider = (*fakeProvider)(nil)

func (f *fakeProvider) Acquire(ctx context.Context, r provider.LeaseRequest) (provider.Lease, error) {
	if f.AcquireFunc == nil {
		return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, Endpoint: r.Endpoint, FencingToken: 1}, nil
	}
	return f.AcquireFunc(ctx, r)
}

func (f *fakeProvider) Renew(ctx context.Context, l provider.Lease, ttl time.Duration) (provider.Lease, error) {
	if f.RenewFunc == nil {
		return l, nil
	}
	return f.RenewFunc(ctx, l, ttl)
}

func (f *fakeProvider) Release(ctx context.Context, l provider.Lease) error {
	if f.ReleaseFunc == nil {
		return nil
	}
	return f.ReleaseFunc(ctx, l)
}

func (f *fakeProvider) Leader(ctx context.Context, name string) (*cluster.Leader, error) {
	if f.LeaderFunc == nil {
		return nil, nil
	}
	return f.LeaderFunc(ctx, name)
}

// fakeConfig is a configuration over p with the test timings.
func fakeConfig(t *testing.T, id string, p provider.Provider) cluster.Config {
	return cluster.Config{
		NodeID:            id,
		Provider:          p,
		LeaseTTL:          testdb.LeaseTTL,
		HeartbeatInterval: testdb.Heartbeat,
		FenceTimeout:      testdb.FenceTimeout,
		Logger:            testdb.Logger(t),
	}
}

// startFake starts a node over the fake provider p, shut down when the
// test ends.
func startFake(t *testing.T, p provider.Provider) *node {
	t.Helper()
	log := &eventLog{}
	cfg := fakeConfig(t, "a", p)
	cfg.OnTransition = log.add
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	return &node{Cluster: c, events: log}
}

// leaderProvider grants every acquisition with token 1 and reports the
// last holder as leader.
func leaderProvider() *fakeProvider {
	var holder atomic.Value
	holder.Store("")
	return &fakeProvider{
		AcquireFunc: func(_ context.Context, r provider.LeaseRequest) (provider.Lease, error) {
			holder.Store(r.Holder)
			return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: 1}, nil
		},
		LeaderFunc: func(context.Context, string) (*cluster.Leader, error) {
			return &cluster.Leader{NodeID: holder.Load().(string), FencingToken: 1}, nil
		},
	}
}

// initFailer is a store that cannot be prepared, as an unreachable
// database: Init fails with err, so New and cluster.Init do.
type initFailer struct {
	provider.Provider
	err error
}

func (p initFailer) Init(context.Context) error { return p.err }

// leaseBook is a one-lease store for a fake provider: it grants the lease
// when free, renews and releases only the term that holds it.
type leaseBook struct {
	mu       sync.Mutex
	holder   string // instance holding the lease, "" when free
	token    uint64
	failRen  bool // renews fail with a transient error
	released chan uint64
}

func newLeaseBook() *leaseBook { return &leaseBook{released: make(chan uint64, 16)} }

func (b *leaseBook) provider() *fakeProvider {
	return &fakeProvider{
		AcquireFunc: func(_ context.Context, r provider.LeaseRequest) (provider.Lease, error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.holder != "" {
				return provider.Lease{}, &cluster.LeaseHeldError{Holder: "other", Instance: b.holder, FencingToken: b.token, Remaining: time.Second}
			}
			b.token++
			b.holder = r.Instance
			return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: b.token}, nil
		},
		RenewFunc: func(_ context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			switch {
			case b.holder != l.Instance || b.token != l.FencingToken:
				return l, cluster.ErrLeaseLost
			case b.failRen:
				return l, errors.New("store unavailable")
			}
			return l, nil
		},
		ReleaseFunc: func(_ context.Context, l provider.Lease) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.holder == l.Instance && (l.FencingToken == 0 || l.FencingToken == b.token) {
				b.holder = ""
				b.released <- b.token
			}
			return nil
		},
	}
}

// take hands the lease to another node behind its holder's back.
func (b *leaseBook) take() {
	b.mu.Lock()
	b.token++
	b.holder = "other-instance"
	b.mu.Unlock()
}

func (b *leaseBook) failRenews() {
	b.mu.Lock()
	b.failRen = true
	b.mu.Unlock()
}

func (b *leaseBook) held() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.holder != "" && b.holder != "other-instance"
}

// startBook starts node "a" over book with the handler h, then the
// handlers of edit.
func startBook(t *testing.T, book *leaseBook, h *handlerShutdown, edit ...func(*cluster.Config)) *node {
	t.Helper()
	log := &eventLog{}
	cfg := fakeConfig(t, "a", book.provider())
	cfg.OnTransition = log.add
	withHandler(h.handle)(&cfg)
	for _, e := range edit {
		e(&cfg)
	}
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	h.give(c)
	return &node{Cluster: c, events: log}
}
