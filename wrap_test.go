package cluster_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

// A wrapper counts renews and keeps every capability of the default
// provider, by embedding it (metered) or by delegating each method
// (delegating).
type wrapper interface {
	provider.Provider
	provider.Initializer
	renewCount() int64
}

// metered wraps the default provider as the docs advise, to count renews:
// it embeds *cluster.DBProvider, so every capability stays.
type metered struct {
	*cluster.DBProvider
	renews atomic.Int64
}

func (m *metered) Renew(ctx context.Context, l provider.Lease, ttl time.Duration) (provider.Lease, error) {
	m.renews.Add(1)
	return m.DBProvider.Renew(ctx, l, ttl)
}

func (m *metered) renewCount() int64 { return m.renews.Load() }

// delegating wraps the default provider without embedding it: each method
// of each capability calls the inner provider's, so the node reaches it
// only through the exported interfaces, watching releases included.
type delegating struct {
	p      *cluster.DBProvider
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
	provider.ConfigStore
	provider.ReleaseWatcher
} = (*delegating)(nil)

func (d *delegating) renewCount() int64 { return d.renews.Load() }

func (d *delegating) Acquire(ctx context.Context, req provider.LeaseRequest) (provider.Lease, error) {
	return d.p.Acquire(ctx, req)
}
func (d *delegating) Renew(ctx context.Context, l provider.Lease, ttl time.Duration) (provider.Lease, error) {
	d.renews.Add(1)
	return d.p.Renew(ctx, l, ttl)
}
func (d *delegating) Release(ctx context.Context, l provider.Lease) error { return d.p.Release(ctx, l) }
func (d *delegating) Leader(ctx context.Context, name string) (*cluster.Leader, error) {
	return d.p.Leader(ctx, name)
}
func (d *delegating) Init(ctx context.Context) error        { return d.p.Init(ctx) }
func (d *delegating) CheckSchema(ctx context.Context) error { return d.p.CheckSchema(ctx) }
func (d *delegating) ReleaseInstance(ctx context.Context, name, holder, instance string) error {
	return d.p.ReleaseInstance(ctx, name, holder, instance)
}
func (d *delegating) Fence(ctx context.Context, tx provider.Querier, l provider.Lease, ttl time.Duration) error {
	return d.p.Fence(ctx, tx, l, ttl)
}
func (d *delegating) WriteTip(ctx context.Context, tx provider.Querier, tip provider.ChainTip) error {
	return d.p.WriteTip(ctx, tx, tip)
}
func (d *delegating) ReadTip(ctx context.Context, tx provider.Querier, chain string) (provider.ChainTip, bool, error) {
	return d.p.ReadTip(ctx, tx, chain)
}
func (d *delegating) HighWater(ctx context.Context, scope string) (uint64, bool, error) {
	return d.p.HighWater(ctx, scope)
}
func (d *delegating) ChainRows(ctx context.Context, ch cluster.Chain, at uint64) (provider.ChainRows, error) {
	return d.p.ChainRows(ctx, ch, at)
}
func (d *delegating) LeaseToken(ctx context.Context, name string) (uint64, error) {
	return d.p.LeaseToken(ctx, name)
}
func (d *delegating) ReadVaultState(ctx context.Context, scope string) (provider.VaultState, bool, error) {
	return d.p.ReadVaultState(ctx, scope)
}
func (d *delegating) InsertVaultState(ctx context.Context, scope, fingerprint, node string) error {
	return d.p.InsertVaultState(ctx, scope, fingerprint, node)
}
func (d *delegating) RotateVaultState(ctx context.Context, scope, from, to, node string) (bool, error) {
	return d.p.RotateVaultState(ctx, scope, from, to, node)
}
func (d *delegating) Join(ctx context.Context, scope string, m cluster.Member) error {
	return d.p.Join(ctx, scope, m)
}
func (d *delegating) Seen(ctx context.Context, scope, instance string) error {
	return d.p.Seen(ctx, scope, instance)
}
func (d *delegating) Leave(ctx context.Context, scope, instance string) error {
	return d.p.Leave(ctx, scope, instance)
}
func (d *delegating) Members(ctx context.Context, scope string, timeout time.Duration) ([]cluster.Member, error) {
	return d.p.Members(ctx, scope, timeout)
}
func (d *delegating) SeenByLease() bool { return d.p.SeenByLease() }
func (d *delegating) PeekLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest, window time.Duration) (*cluster.Lane, provider.LaneCensus, error) {
	return d.p.PeekLane(ctx, tx, req, window)
}
func (d *delegating) ClaimLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest) (cluster.Lane, error) {
	return d.p.ClaimLane(ctx, tx, req)
}
func (d *delegating) RenewLanes(ctx context.Context, scope, instance string, ttl, window time.Duration) (provider.LaneReport, error) {
	return d.p.RenewLanes(ctx, scope, instance, ttl, window)
}
func (d *delegating) ReleaseLane(ctx context.Context, scope, key, holder, instance string) error {
	return d.p.ReleaseLane(ctx, scope, key, holder, instance)
}
func (d *delegating) ReleaseLanes(ctx context.Context, scope, holder, instance string) error {
	return d.p.ReleaseLanes(ctx, scope, holder, instance)
}
func (d *delegating) ReadLane(ctx context.Context, scope, key string) (*cluster.Lane, error) {
	return d.p.ReadLane(ctx, scope, key)
}
func (d *delegating) JoinLanes(ctx context.Context, scope, instance string) error {
	return d.p.JoinLanes(ctx, scope, instance)
}
func (d *delegating) ReadConfigVersion(ctx context.Context, scope string) (uint64, error) {
	return d.p.ReadConfigVersion(ctx, scope)
}
func (d *delegating) BumpConfigVersion(ctx context.Context, scope string) (uint64, error) {
	return d.p.BumpConfigVersion(ctx, scope)
}
func (d *delegating) WatchReleases(ctx context.Context, name, instance string, wake func(), live func(bool)) func() {
	return d.p.WatchReleases(ctx, name, instance, wake, live)
}

// wrappers are the two ways to wrap the default provider, by name.
var wrappers = map[string]func(*cluster.DBProvider) wrapper{
	"embedding":  func(p *cluster.DBProvider) wrapper { return &metered{DBProvider: p} },
	"delegating": func(p *cluster.DBProvider) wrapper { return &delegating{p: p} },
}

func newWrapped(t *testing.T, tg testdb.Target, wrap func(*cluster.DBProvider) wrapper) wrapper {
	t.Helper()
	p, err := cluster.NewDBProvider(tg.Open(t), "", tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	return wrap(p)
}

// A provider that wraps the default one, by embedding it or by delegating
// each method, passes the conformance suite (lanes included) and keeps
// Fence, Chains, WitnessFile, VaultKeys and the wake-up of the nodes that
// share it on a release.
func TestWrappedProviderKeepsCapabilities(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		for name, wrap := range wrappers {
			t.Run(name, func(t *testing.T) { testWrapped(t, tg, wrap) })
		}
	})
}

func testWrapped(t *testing.T, tg testdb.Target, wrap func(*cluster.DBProvider) wrapper) {
	t.Run("conformance", func(t *testing.T) {
		providertest.Run(t, func(t *testing.T) func() provider.Provider {
			tg := testdb.New(t, tg.Dialect)
			return func() provider.Provider {
				w := newWrapped(t, tg, wrap)
				if err := w.Init(context.Background()); err != nil {
					t.Fatal(err)
				}
				return w
			}
		})
	})

	t.Run("lanes", func(t *testing.T) {
		providertest.RunLanes(t, func(t *testing.T) providertest.LaneTarget {
			tg := testdb.New(t, tg.Dialect)
			db := tg.Open(t)
			initProvider(t, tg, db)
			return providertest.LaneTarget{
				Open: func() provider.LaneStore {
					w := newWrapped(t, tg, wrap)
					if err := w.Init(context.Background()); err != nil {
						t.Fatal(err)
					}
					return w.(provider.LaneStore)
				},
				Begin: func(ctx context.Context) (providertest.Tx, error) {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return nil, err
					}
					return providertest.SQLTx(tx), nil
				},
			}
		})
	})

	t.Run("wake", func(t *testing.T) {
		tg := testdb.New(t, tg.Dialect)
		resignWakesSharer(t, tg, newWrapped(t, tg, wrap))
	})

	ctx := context.Background()
	tg = testdb.New(t, tg.Dialect)
	db := tg.Open(t)
	table := createAuditTable(t, tg, db)
	m := newWrapped(t, tg, wrap)
	witness := filepath.Join(t.TempDir(), "witness.json")
	a := startOn(t, tg, db, "a", withAudit(table), func(c *cluster.Config) {
		c.Provider = m
		c.WitnessFile = witness
		c.VaultKeyFingerprint = strings.Repeat("ab", cluster.VaultKeyFingerprintLen/2)
	})
	appendAudit(t, tg, a, table, 1, 3) // Fence and AdvanceTip through the wrapper
	afterRenew(t, tg, db)
	if m.renewCount() == 0 {
		t.Fatal("the wrapper saw no renew")
	}
	a.Shutdown(ctx)
	// The chain checks and the witness run through it too: a database
	// restored to an earlier tip is refused at boot. (Tip 2, just before
	// the last AdvanceTip, is the point the witness cannot tell from a
	// rolled-back transaction; tip 1 it can.)
	restoreChain(t, tg, db, table, 1)
	cfg := tg.Config(t, db, "a")
	withAudit(table)(&cfg)
	cfg.Provider = newWrapped(t, tg, wrap)
	cfg.WitnessFile = witness
	if _, err := cluster.New(ctx, cfg); !errors.Is(err, cluster.ErrRollbackDetected) {
		t.Fatalf("New over a restored database through the wrapper = %v, want ErrRollbackDetected", err)
	}
}
