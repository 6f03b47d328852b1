package testdb

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/provider"
)

// Delegating wraps the default provider without embedding it: each method
// of each capability calls the inner provider's, so a node reaches it only
// through the exported interfaces of package provider, watching releases
// included. It counts renews.
type Delegating struct {
	P      *cluster.DBProvider
	renews atomic.Int64
}

var _ interface {
	provider.Provider
	provider.Initializer
	provider.SchemaChecker
	provider.InstanceReleaser
	provider.Fencer
	provider.ChainStore
	provider.StateStore
	provider.MemberStore
	provider.LaneStore
	provider.Transactor
	provider.ConfigStore
	provider.ReleaseWatcher
} = (*Delegating)(nil)

// RenewCount is how many renews went through the wrapper.
func (d *Delegating) RenewCount() int64 { return d.renews.Load() }

func (d *Delegating) Acquire(ctx context.Context, req provider.LeaseRequest) (provider.Lease, error) {
	return d.P.Acquire(ctx, req)
}
func (d *Delegating) Renew(ctx context.Context, l provider.Lease, ttl time.Duration) (provider.Lease, error) {
	d.renews.Add(1)
	return d.P.Renew(ctx, l, ttl)
}
func (d *Delegating) Release(ctx context.Context, l provider.Lease) error { return d.P.Release(ctx, l) }
func (d *Delegating) Leader(ctx context.Context, name string) (*cluster.Leader, error) {
	return d.P.Leader(ctx, name)
}
func (d *Delegating) Init(ctx context.Context) error { return d.P.Init(ctx) }
func (d *Delegating) InTx(ctx context.Context, f func(provider.Querier) error) error {
	return d.P.InTx(ctx, f)
}
func (d *Delegating) CheckSchema(ctx context.Context) error { return d.P.CheckSchema(ctx) }
func (d *Delegating) ReleaseInstance(ctx context.Context, name, holder, instance string) error {
	return d.P.ReleaseInstance(ctx, name, holder, instance)
}
func (d *Delegating) Fence(ctx context.Context, tx provider.Querier, l provider.Lease, ttl time.Duration) error {
	return d.P.Fence(ctx, tx, l, ttl)
}
func (d *Delegating) WriteTip(ctx context.Context, tx provider.Querier, tip provider.ChainTip) error {
	return d.P.WriteTip(ctx, tx, tip)
}
func (d *Delegating) ReadTip(ctx context.Context, tx provider.Querier, chain string) (provider.ChainTip, bool, error) {
	return d.P.ReadTip(ctx, tx, chain)
}
func (d *Delegating) HighWater(ctx context.Context, scope string) (uint64, bool, error) {
	return d.P.HighWater(ctx, scope)
}
func (d *Delegating) ChainRows(ctx context.Context, ch cluster.Chain, at uint64) (provider.ChainRows, error) {
	return d.P.ChainRows(ctx, ch, at)
}
func (d *Delegating) LeaseToken(ctx context.Context, name string) (uint64, error) {
	return d.P.LeaseToken(ctx, name)
}
func (d *Delegating) ReadVaultState(ctx context.Context, scope string) (provider.VaultState, bool, error) {
	return d.P.ReadVaultState(ctx, scope)
}
func (d *Delegating) InsertVaultState(ctx context.Context, scope, fingerprint, node string) error {
	return d.P.InsertVaultState(ctx, scope, fingerprint, node)
}
func (d *Delegating) RotateVaultState(ctx context.Context, scope, from, to, node string) (bool, error) {
	return d.P.RotateVaultState(ctx, scope, from, to, node)
}
func (d *Delegating) Join(ctx context.Context, scope string, m cluster.Member) error {
	return d.P.Join(ctx, scope, m)
}
func (d *Delegating) Seen(ctx context.Context, scope, instance string) error {
	return d.P.Seen(ctx, scope, instance)
}
func (d *Delegating) Leave(ctx context.Context, scope, instance string) error {
	return d.P.Leave(ctx, scope, instance)
}
func (d *Delegating) Members(ctx context.Context, scope string, timeout time.Duration) ([]cluster.Member, error) {
	return d.P.Members(ctx, scope, timeout)
}
func (d *Delegating) SeenByLease() bool { return d.P.SeenByLease() }
func (d *Delegating) PeekLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest, window time.Duration) (*cluster.Lane, provider.LaneCensus, error) {
	return d.P.PeekLane(ctx, tx, req, window)
}
func (d *Delegating) ClaimLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest) (cluster.Lane, error) {
	return d.P.ClaimLane(ctx, tx, req)
}
func (d *Delegating) RenewLanes(ctx context.Context, scope, instance string, ttl, window time.Duration) (provider.LaneReport, error) {
	return d.P.RenewLanes(ctx, scope, instance, ttl, window)
}
func (d *Delegating) ReleaseLane(ctx context.Context, scope, key, holder, instance string) error {
	return d.P.ReleaseLane(ctx, scope, key, holder, instance)
}
func (d *Delegating) ReleaseLanes(ctx context.Context, scope, holder, instance string) error {
	return d.P.ReleaseLanes(ctx, scope, holder, instance)
}
func (d *Delegating) ReadLane(ctx context.Context, scope, key string) (*cluster.Lane, error) {
	return d.P.ReadLane(ctx, scope, key)
}
func (d *Delegating) JoinLanes(ctx context.Context, scope, instance string) error {
	return d.P.JoinLanes(ctx, scope, instance)
}
func (d *Delegating) ReadConfigVersion(ctx context.Context, scope string) (uint64, error) {
	return d.P.ReadConfigVersion(ctx, scope)
}
func (d *Delegating) BumpConfigVersion(ctx context.Context, scope string) (uint64, error) {
	return d.P.BumpConfigVersion(ctx, scope)
}
func (d *Delegating) WatchReleases(ctx context.Context, name, instance string, wake func(), live func(bool)) func() {
	return d.P.WatchReleases(ctx, name, instance, wake, live)
}

// ResignWakesSharer starts nodes a and b on provider p, polling 5 s
// apart, and checks that b leads within 3 s of a's Resign: woken through
// p (its provider.ReleaseWatcher), not by its poll.
func ResignWakesSharer(t *testing.T, tg Target, p provider.Provider) {
	t.Helper()
	node := func(id string, observe func(cluster.Operation)) *cluster.Cluster {
		cfg := tg.Config(t, nil, id)
		cfg.Provider = p
		// Polls 5 s apart: a takeover within 3 s comes from the wake.
		cfg.LeaseTTL, cfg.HeartbeatInterval, cfg.FenceTimeout = 15*time.Second, 5*time.Second, 10*time.Second
		cfg.Observer = observe
		c, err := cluster.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Shutdown(context.Background()) })
		return c
	}
	a := node("a", nil)
	attempts := make(chan struct{}, 16)
	b := node("b", func(o cluster.Operation) {
		if o.Kind == cluster.OpAcquire && o.Outcome == cluster.OutcomeHeld {
			select {
			case attempts <- struct{}{}:
			default:
			}
		}
	})
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	<-attempts // b just tried: its next poll is 5 s away
	if err := a.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	resigned := time.Now()
	for !b.IsLeader() {
		if time.Since(resigned) > 3*time.Second {
			t.Fatal("b did not take over within 3s of a's resignation through the shared provider: it was not woken")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("b led %v after a resigned", time.Since(resigned).Round(time.Millisecond))
}
