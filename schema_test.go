package cluster_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// SchemaSQL is the whole schema: applied by hand (as a migration tool
// would), it lets nodes with SkipMigrations start, lead and be guarded;
// without it they fail with ErrSchema saying what to run.
func TestSchemaSQLAndSkipMigrations(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		skip := func(c *cluster.Config) { c.SkipMigrations = true }

		cfg := tg.Config(t, tg.Open(t), "a")
		skip(&cfg)
		_, err := cluster.New(ctx, cfg)
		if !errors.Is(err, cluster.ErrSchema) || !strings.Contains(err.Error(), "SchemaSQL") {
			t.Fatalf("New with SkipMigrations and no tables = %v, want ErrSchema naming SchemaSQL", err)
		}

		ddl, err := cluster.SchemaSQL(tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		db := tg.Open(t)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, stmt := range splitSQL(ddl) {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("apply SchemaSQL: %v\n%s", err, stmt)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		a := start(t, tg, "a", skip)
		if !a.IsLeader() {
			t.Fatal("a node with SkipMigrations over SchemaSQL's tables does not lead")
		}
		refusedWith(t, tg, db, "SF004", cluster.ErrLeaseDeleted, "DELETE FROM "+tg.Prefix+"lease")

		if _, err := cluster.SchemaSQL("oracle", ""); !errors.Is(err, cluster.ErrInvalidConfig) {
			t.Fatalf("SchemaSQL of an unknown dialect = %v", err)
		}
	})
}
