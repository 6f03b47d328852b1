package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

// initProvider returns the default provider over db, its tables created.
func initProvider(t *testing.T, tg testdb.Target, db *sql.DB) *cluster.DBProvider {
	t.Helper()
	p, err := cluster.NewDBProvider(db, "", tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDBProviderConformance(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			providertest.Run(t, func(t *testing.T) func() provider.Provider {
				tg := testdb.New(t, d)
				return func() provider.Provider { return initProvider(t, tg, tg.Open(t)) }
			})
		})
	}
}

// The default provider passes the lane suite on every dialect, claiming
// in database/sql transactions.
func TestDBProviderLaneConformance(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			providertest.RunLanes(t, func(t *testing.T) providertest.LaneTarget {
				return sqlLaneTarget(t, testdb.New(t, d))
			})
		})
	}
}

// sqlLaneTarget is the lane suite's target on tg: the default provider,
// with claims in database/sql transactions.
func sqlLaneTarget(t *testing.T, tg testdb.Target) providertest.LaneTarget {
	t.Helper()
	db := tg.Open(t)
	initProvider(t, tg, db)
	return providertest.LaneTarget{
		Open: func() provider.LaneStore { return initProvider(t, tg, tg.Open(t)) },
		Begin: func(ctx context.Context) (providertest.Tx, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			return providertest.SQLTx(tx), nil
		},
	}
}

// Many nodes booting at once must all create or find the schema.
func TestSchemaConcurrentInit(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			db := tg.Open(t)
			wg.Go(func() {
				p, err := cluster.NewDBProvider(db, "", tg.Prefix)
				if err == nil {
					err = p.Init(context.Background())
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("node %d: %v", i, err)
			}
		}
	})
}

func TestSchemaNewerVersionRefused(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		p := initProvider(t, tg, db)
		q := "INSERT INTO " + tg.Prefix + "schema_version (version, applied_at) VALUES (99, 0)"
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
		err := p.Init(ctx)
		if !errors.Is(err, cluster.ErrSchema) || !strings.Contains(err.Error(), "99") {
			t.Fatalf("Init over schema version 99 = %v, want ErrSchema naming the version", err)
		}
	})
}

func TestMissingTableIsSchemaError(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		p := initProvider(t, tg, db)
		if _, err := db.ExecContext(ctx, "DROP TABLE "+tg.Prefix+"lease"); err != nil {
			t.Fatal(err)
		}
		_, err := p.Leader(ctx, "leader")
		if !errors.Is(err, cluster.ErrSchema) || !strings.Contains(err.Error(), "missing") {
			t.Fatalf("Leader without the lease table = %v, want ErrSchema saying the table is missing", err)
		}
	})
}

// The longest TablePrefix Validate accepts builds every table, trigger and
// constraint on every dialect, and the schema works under it; one byte
// more is refused. PostgreSQL would truncate a longer name (so prefixes
// differing past the limit would share tables) and MySQL would refuse it.
func TestLongestTablePrefix(t *testing.T) {
	t.Parallel()
	limit := 63 - len(longestSchemaSuffix(t))
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		// Keep the target's unique prefix in front, so its tables are
		// dropped with the test's.
		tg.Prefix += strings.Repeat("x", limit-len(tg.Prefix))
		db := tg.Open(t)
		tooLong := tg.Config(t, db, "a")
		tooLong.TablePrefix += "x"
		if err := tooLong.Validate(); !errors.Is(err, cluster.ErrInvalidConfig) ||
			!strings.Contains(err.Error(), fmt.Sprintf("%d bytes) must be at most %d bytes", limit+1, limit)) {
			t.Fatalf("Validate with a %d-byte prefix = %v, want ErrInvalidConfig naming the limit %d", limit+1, err, limit)
		}

		table := createAuditTable(t, tg, db)
		a := startOn(t, tg, db, "a", withAudit(table))
		if !a.IsLeader() {
			t.Fatal("no leader under the longest prefix")
		}
		appendAudit(t, tg, a, table, 1, 2) // Fence and AdvanceTip, through the tip triggers
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, bind(tg.Dialect, "UPDATE "+tg.Prefix+"chain_tips SET at_counter = ?"), 1); err == nil {
			t.Fatal("the tip guard trigger did not refuse a tip moving backwards")
		}
	})
}
