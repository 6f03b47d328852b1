package providertest_test

import (
	"context"
	"testing"
	"time"

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
			p := open(t, tg)
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
					t.Fatal("b did not take over within 3s of a's resignation through the delegating wrapper: it was not woken")
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("b led %v after a resigned", time.Since(resigned).Round(time.Millisecond))
		})
	})
}
