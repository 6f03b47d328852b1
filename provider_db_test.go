package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/providertest"
	"github.com/sqlfence/cluster/internal/testdb"
)

// initProvider returns the default provider over db, its tables created.
func initProvider(t *testing.T, tg testdb.Target, db *sql.DB) cluster.Provider {
	t.Helper()
	p, err := cluster.NewDBProvider(db, "", tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.(cluster.Initializer).Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDBProviderConformance(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			providertest.Run(t, func(t *testing.T) func() cluster.Provider {
				tg := testdb.New(t, d)
				return func() cluster.Provider { return initProvider(t, tg, tg.Open(t)) }
			})
		})
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
					err = p.(cluster.Initializer).Init(context.Background())
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
		err := p.(cluster.Initializer).Init(ctx)
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
