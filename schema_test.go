package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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

// splitSQL splits a schema file as the package does: a statement ends at a
// line that starts in column 0 and ends with ";".
func splitSQL(src string) []string {
	var out []string
	var cur strings.Builder
	delim := ";"
	for _, line := range strings.SplitAfter(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if d, ok := strings.CutPrefix(trimmed, "DELIMITER "); ok && cur.Len() == 0 {
			delim = d // the mysql client's command, as it reads it
			continue
		}
		cur.WriteString(line)
		if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") && strings.HasSuffix(trimmed, delim) {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), delim))
			cur.Reset()
		}
	}
	return out
}

// The migration runner takes a database at this build's schema version
// (the baseline) to the next one: a synthetic SchemaVersion+1 whose schema file
// is the baseline's plus one table. Migrating applies the file once,
// under the schema lock, records the new version and leaves the lease
// where it was; migrating again runs no DDL; and a build of the baseline
// then refuses the newer database with ErrSchema, saying to upgrade.
func TestSchemaUpgradeToNextVersion(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		a := startOn(t, tg, db, "a")
		waitFor(t, 5*time.Second, "a to lead", a.IsLeader)
		token := a.FencingToken()

		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		baseline := cluster.SchemaDDL(tg.Dialect, tg.Prefix)
		next := int64(cluster.SchemaVersion + 1)
		extra := "CREATE TABLE " + tg.Prefix + "next_version (id INTEGER PRIMARY KEY)"
		if err := cluster.MigrateTo(ctx, p, next, baseline+"\n"+extra+";\n"); err != nil {
			t.Fatalf("migrate from %d to %d: %v", cluster.SchemaVersion, next, err)
		}
		var version int64
		if err := db.QueryRowContext(ctx, "SELECT MAX(version) FROM "+tg.Prefix+"schema_version").Scan(&version); err != nil || version != next {
			t.Fatalf("schema version after the migration = %d (%v), want %d", version, err, next)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO "+tg.Prefix+"next_version (id) VALUES (1)"); err != nil {
			t.Fatalf("the next version's table: %v", err)
		}
		if l, err := p.Leader(ctx, "leader"); err != nil || l == nil || l.NodeID != "a" || l.FencingToken != token {
			t.Fatalf("after the migration the lease is %+v (%v); want a's term, token %d", l, err, token)
		}
		// Current: no DDL runs (the table dropped stays dropped).
		if _, err := db.ExecContext(ctx, "DROP TABLE "+tg.Prefix+"next_version"); err != nil {
			t.Fatal(err)
		}
		if err := cluster.MigrateTo(ctx, p, next, baseline+"\n"+extra+";\n"); err != nil {
			t.Fatalf("migrate again at %d: %v", next, err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO "+tg.Prefix+"next_version (id) VALUES (1)"); err == nil {
			t.Fatal("migrating a database already at the version ran its DDL again")
		}
		// The baseline's build refuses the newer tables.
		old, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		if err := old.Init(ctx); !errors.Is(err, cluster.ErrSchema) || !strings.Contains(err.Error(), "newer") {
			t.Fatalf("Init of a version-%d build on version-%d tables = %v; want ErrSchema saying they are newer", cluster.SchemaVersion, next, err)
		}
	})
}

// Tables at version 1 (before members recorded their node timeout) are
// upgraded to the current version by New, on every dialect: the column is added, the
// rows of older nodes keep 0 (judged by the reader's timeout), and a node
// that joins records its own.
func TestSchemaUpgradeFromVersion1(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		var v1 []string
		for _, line := range strings.Split(cluster.SchemaDDL(tg.Dialect, tg.Prefix), "\n") {
			if !strings.Contains(line, "ADD COLUMN") {
				v1 = append(v1, line)
			}
		}
		if err := cluster.MigrateTo(ctx, p, 1, strings.Join(v1, "\n")); err != nil {
			t.Fatalf("create version 1: %v", err)
		}
		if _, err := db.ExecContext(ctx, "SELECT timeout_ms FROM "+tg.Prefix+"nodes"); err == nil {
			t.Fatal("version 1 tables already have timeout_ms: the test does not build version 1")
		}
		// An older node's row, seen just now (a row seen long ago would be
		// taken over by the next join).
		now := time.Now().UnixMilli()
		old := fmt.Sprintf("INSERT INTO %snodes (scope, instance, node_id, host, pid, endpoint, started_at, last_seen, status) VALUES ('leader', 'old-1', 'old', 'h', 1, '', %d, %d, 'active')", tg.Prefix, now, now)
		if _, err := db.ExecContext(ctx, old); err != nil {
			t.Fatal(err)
		}

		a := startOn(t, tg, db, "a") // New upgrades
		var version int64
		if err := db.QueryRowContext(ctx, "SELECT MAX(version) FROM "+tg.Prefix+"schema_version").Scan(&version); err != nil || version != cluster.SchemaVersion {
			t.Fatalf("schema version after New = %d (%v), want %d", version, err, cluster.SchemaVersion)
		}
		ms, err := a.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := testdb.LeaseTTL + 3*testdb.Heartbeat
		for _, m := range ms {
			switch {
			case m.NodeID == "old" && (m.Timeout != 0 || !m.Live):
				t.Errorf("the older node's row: timeout %v, live %v; want 0, and live by a's timeout", m.Timeout, m.Live)
			case m.NodeID == "a" && (m.Timeout != want || !m.Live):
				t.Errorf("a's row: timeout %v, live %v; want %v and live", m.Timeout, m.Live, want)
			}
		}
		if len(ms) != 2 {
			t.Fatalf("members = %+v, want old and a", ms)
		}
	})
}

// On PostgreSQL the tables are found, and migrated, in the schema that
// holds them, not in the first schema of the search_path: with tables in
// schema x whose version row is gone and whose lease guard was dropped,
// and a search_path "y, x", New applies the schema in x (x's guard refuses
// a change of hands under one token again) and creates nothing in y. The
// queries name x, so tables made in y would be a second, unused set, and
// x's would stay unguarded.
func TestSchemaUpgradeInTheTablesSchema(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	admin, x, y, first := leaderInSchemaX(t, tg)
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"DELETE FROM " + x + "." + tg.Prefix + "schema_version",
		"DROP TRIGGER " + tg.Prefix + "lease_guard ON " + x + "." + tg.Prefix + "lease",
	} {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	tgYX := tg
	tgYX.DSN = tg.DSN + "&search_path=" + y + "," + x
	a := start(t, tgYX, "a")
	waitFor(t, 5*time.Second, "a to lead", a.IsLeader)
	if got := a.FencingToken(); got != 2 {
		t.Fatalf("a's term after the migration has token %d, want 2 (the first node's was 1)", got)
	}
	var version, inY int
	if err := admin.QueryRowContext(ctx, "SELECT MAX(version) FROM "+x+"."+tg.Prefix+"schema_version").Scan(&version); err != nil || version != cluster.SchemaVersion {
		t.Fatalf("x's schema version after the migration = %d (%v), want %d", version, err, cluster.SchemaVersion)
	}
	if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", y).Scan(&inY); err != nil || inY != 0 {
		t.Fatalf("the migration made %d tables in %s (%v), want none", inY, y, err)
	}
	refusedWith(t, tg, admin, "SF009", cluster.ErrTokenLowered, "UPDATE "+x+"."+tg.Prefix+"lease SET holder = 'z', instance = 'zi'")
}

// On PostgreSQL a lease table in a schema of the search_path before the
// cluster tables' schema (a role's own schema, "$user", comes first by
// default) would stand in for the lease on every node started from then
// on: a second leader, under tokens the real lease already granted. New
// refuses a search_path in which more than one schema has the lease table.
func TestSchemaRefusesALeaseTableInTwoSchemas(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	admin, x, y, first := leaderInSchemaX(t, tg)

	lease := tg.Prefix + "lease"
	if _, err := admin.ExecContext(ctx, "CREATE TABLE "+y+"."+lease+" (LIKE "+x+"."+lease+" INCLUDING ALL)"); err != nil {
		t.Fatal(err)
	}
	tgYX := tg
	tgYX.DSN = tg.DSN + "&search_path=" + y + "," + x
	db := tgYX.Open(t)
	_, err := cluster.New(ctx, cluster.Config{NodeID: "shadowed", DB: db, TablePrefix: tg.Prefix})
	if !errors.Is(err, cluster.ErrSchema) || !strings.Contains(err.Error(), y+", "+x) {
		t.Fatalf("New with %s.%s before %s's = %v, want ErrSchema naming both schemas", y, lease, x, err)
	}
	if !first.IsLeader() {
		t.Fatal("the first node lost its lease")
	}
}

// leaderInSchemaX makes the PostgreSQL schemas x and y of tg's prefix,
// dropped at the end of the test, and starts a node, first, whose
// search_path is x alone, which creates the cluster tables there and leads.
func leaderInSchemaX(t *testing.T, tg testdb.Target) (admin *sql.DB, x, y string, first *node) {
	t.Helper()
	admin = tg.Open(t)
	x, y = tg.Prefix+"x", tg.Prefix+"y"
	for _, s := range []string{x, y} {
		if _, err := admin.ExecContext(context.Background(), "CREATE SCHEMA "+s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.ExecContext(context.Background(), "DROP SCHEMA "+s+" CASCADE") })
	}
	tgX := tg
	tgX.DSN = tg.DSN + "&search_path=" + x
	first = start(t, tgX, "first")
	waitFor(t, 5*time.Second, "the first node to lead", first.IsLeader)
	return admin, x, y, first
}
