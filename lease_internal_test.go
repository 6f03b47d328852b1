package cluster

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// stallingProvider grants every acquisition with the next token, and
// holds every renew, whatever its context, until hold is closed.
type stallingProvider struct {
	token atomic.Uint64
	hold  chan struct{}
}

func (p *stallingProvider) Acquire(_ context.Context, r provider.LeaseRequest) (provider.Lease, error) {
	return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: p.token.Add(1)}, nil
}

func (p *stallingProvider) Renew(_ context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
	<-p.hold
	return l, nil
}

func (p *stallingProvider) Release(context.Context, provider.Lease) error { return nil }

func (p *stallingProvider) Leader(context.Context, string) (*Leader, error) { return nil, nil }

// A term's timer that runs late, after the trust window's deadline u (a
// GC pause, a stopped process, a busy scheduler), must still move the
// deadline away from u when it ends the window. Otherwise a renew paused
// between its clock read (before u) and its compare-and-swap from u
// succeeds after the timer ran, and makes IsLeader true again for a term
// whose context the timer has cancelled: a leader whose leader work never
// runs. The test holds the timer off c.mu until past u; the provider
// holds the heartbeat's renew, so that nothing else moves the deadline,
// and the test makes that paused renew's compare-and-swap itself.
func TestExpireLateNeverLeavesTheDeadline(t *testing.T) {
	p := &stallingProvider{hold: make(chan struct{})}
	c, err := New(context.Background(), Config{
		NodeID: "a", Provider: p,
		LeaseTTL: time.Second, HeartbeatInterval: 100 * time.Millisecond, FenceTimeout: 400 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	defer close(p.hold) // before Shutdown, which waits for the renew in flight
	term := c.term.Load()
	u := c.until.Load()
	if term == nil || !c.IsLeader() {
		t.Fatal("not leading after New")
	}

	c.mu.Lock() // the timer's expire waits for it
	for mono() <= u+int64(time.Millisecond) {
		time.Sleep(time.Millisecond)
	}
	c.mu.Unlock()
	select {
	case <-term.ctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the term's timer did not end the term after its window")
	}
	if c.until.CompareAndSwap(u, monoAfter(u-1, c.cfg.FenceTimeout)) {
		t.Fatalf("after its late timer ended term %d, a renew that read the clock before the deadline extended the ended window", term.lease.FencingToken)
	}
	if c.IsLeader() || c.FencingToken() != 0 {
		t.Fatal("IsLeader true after the window ended")
	}
}
