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
	"github.com/sqlfence/cluster/providertest"
)

// metered wraps the default provider as the docs advise, to count renews:
// it embeds *cluster.DBProvider, so every capability stays.
type metered struct {
	*cluster.DBProvider
	renews atomic.Int64
}

func (m *metered) Renew(ctx context.Context, l cluster.Lease, ttl time.Duration) (cluster.Lease, error) {
	m.renews.Add(1)
	return m.DBProvider.Renew(ctx, l, ttl)
}

func newMetered(t *testing.T, tg testdb.Target) *metered {
	t.Helper()
	p, err := cluster.NewDBProvider(tg.Open(t), "", tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	return &metered{DBProvider: p}
}

// A provider that embeds the default one passes the conformance suite and
// keeps Fence, Chains, WitnessFile and VaultKeys working.
func TestWrappedProviderKeepsCapabilities(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		t.Run("conformance", func(t *testing.T) {
			providertest.Run(t, func(t *testing.T) func() cluster.Provider {
				tg := testdb.New(t, tg.Dialect)
				return func() cluster.Provider {
					m := newMetered(t, tg)
					if err := m.Init(context.Background()); err != nil {
						t.Fatal(err)
					}
					return m
				}
			})
		})

		ctx := context.Background()
		db := tg.Open(t)
		table := createAuditTable(t, tg, db)
		m := newMetered(t, tg)
		witness := filepath.Join(t.TempDir(), "witness.json")
		a := startOn(t, tg, db, "a", withAudit(table), func(c *cluster.Config) {
			c.Provider = m
			c.WitnessFile = witness
			c.VaultKeyFingerprint = strings.Repeat("ab", cluster.VaultKeyFingerprintLen/2)
		})
		appendAudit(t, tg, a, table, 1, 3) // Fence and AdvanceTip through the wrapper
		afterRenew(t, tg, db)
		if m.renews.Load() == 0 {
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
		cfg.Provider = newMetered(t, tg)
		cfg.WitnessFile = witness
		if _, err := cluster.New(ctx, cfg); !errors.Is(err, cluster.ErrRollbackDetected) {
			t.Fatalf("New over a restored database through the wrapper = %v, want ErrRollbackDetected", err)
		}
	})
}
