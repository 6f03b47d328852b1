package providertest_test

import (
	"context"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

// The default provider wrapped by delegation (each method of each
// capability calls the inner provider's; nothing is embedded) passes the
// conformance suites on every dialect, and keeps the fast handoff: nodes
// that share it are woken by a release through provider.ReleaseWatcher,
// not at their next poll. The same wrapper keeps Fence, chains, the
// witness and vault keys (TestWrappedProviderKeepsCapabilities, in the
// root package, where the helpers for those live).
func TestDelegatingDBProvider(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		open := func(t *testing.T, tg testdb.Target) *testdb.Delegating {
			p, err := cluster.NewDBProvider(tg.Open(t), "", tg.Prefix)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Init(context.Background()); err != nil {
				t.Fatal(err)
			}
			return &testdb.Delegating{P: p}
		}

		t.Run("conformance", func(t *testing.T) {
			providertest.Run(t, func(t *testing.T) func() provider.Provider {
				tg := testdb.New(t, tg.Dialect)
				return func() provider.Provider { return open(t, tg) }
			})
		})

		t.Run("lanes", func(t *testing.T) {
			providertest.RunLanes(t, func(t *testing.T) providertest.LaneTarget {
				tg := testdb.New(t, tg.Dialect)
				first := open(t, tg) // creates the tables before any Begin
				db := tg.Open(t)
				return providertest.LaneTarget{
					Open: func() provider.LaneStore {
						if first != nil {
							p := first
							first = nil
							return p
						}
						return open(t, tg)
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
			testdb.ResignWakesSharer(t, tg, open(t, tg))
		})
	})
}
