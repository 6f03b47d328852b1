package cluster_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// A database made by schema version 2 is upgraded by New: the new trigger
// bodies reach every dialect (on MySQL the version-2 triggers are dropped
// after their successors exist), the high-water marks are seeded from the
// tokens already granted, and no token is granted twice.
func TestSchemaUpgradeFromVersion2(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		db := tg.Open(t)
		createAtVersion(t, tg, db, 2, oldLease(tg))
		startUpgraded(t, tg, db)
		// A rule that version 2 did not have.
		refusedWith(t, tg, db, "SF004", cluster.ErrLeaseDeleted, "UPDATE "+tg.Prefix+"lease SET name = 'renamed'")
		if tg.Dialect == cluster.MySQL {
			var old int
			if err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME LIKE ?",
				tg.Prefix+"%guard%").Scan(&old); err != nil || old != 0 {
				t.Fatalf("%d version-2 triggers remain (%v)", old, err)
			}
		}
	})
}

// A database made by schema version 3 is upgraded by New to this build's:
// on PostgreSQL the lease statements' functions appear (version 4), on
// every dialect the version is recorded and the lease goes on from its
// token.
func TestSchemaUpgradeFromVersion3(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		createAtVersion(t, tg, db, 3, oldLease(tg))
		if tg.Dialect == cluster.Postgres {
			var n int
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_proc WHERE proname = $1 AND pronamespace = current_schema()::regnamespace", tg.Prefix+"acquire").Scan(&n); err != nil || n != 0 {
				t.Fatalf("version 3 has %d acquire functions (%v); want none", n, err)
			}
		}
		handsOffAfterUpgrade(t, tg, startUpgraded(t, tg, db))
	})
}

// A database made by schema version 4 is upgraded by New to this build's:
// on PostgreSQL the membership rows gain hears_releases (0 for the
// members already there, which a release then does not name until they
// record it), on every dialect the version is recorded and the lease goes
// on from its token.
func TestSchemaUpgradeFromVersion4(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		createAtVersion(t, tg, db, 4, oldLease(tg),
			"INSERT INTO "+tg.Prefix+"nodes (scope, instance, node_id, host, pid, endpoint, started_at, last_seen, status) VALUES ('other', 'i', 'old', 'h', 1, '', 0, 0, 'active')")
		// An operator's tool of this build lists the members of tables
		// not yet upgraded (no hears_releases column on PostgreSQL).
		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		if ms, err := p.Members(ctx, "other", time.Minute); err != nil || len(ms) != 1 || ms[0].NodeID != "old" || ms[0].HearsReleases {
			t.Fatalf("members of version-4 tables = %+v, %v; want node old, not hearing", ms, err)
		}
		a := startUpgraded(t, tg, db)
		if tg.Dialect == cluster.Postgres {
			var hears int
			if err := db.QueryRowContext(ctx, "SELECT hears_releases FROM "+tg.Prefix+"nodes WHERE scope = 'other' AND instance = 'i'").Scan(&hears); err != nil || hears != 0 {
				t.Fatalf("hears_releases of a member from before the upgrade = %d (%v), want 0", hears, err)
			}
		}
		handsOffAfterUpgrade(t, tg, a)
	})
}

// A database made by schema version 5 is upgraded by New to this build's:
// on PostgreSQL the release function that hands the term over appears
// (version 6), beside the version-5 one that running nodes of version 5
// call, which now names members of either version; a member of version 5
// (hears_releases 1) is named by a release but never handed the term, as
// it would not know to take it up; on every dialect the version is
// recorded and the lease goes on from its token.
func TestSchemaUpgradeFromVersion5(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		createAtVersion(t, tg, db, 5, oldLease(tg))
		if tg.Dialect == cluster.Postgres {
			if n := functions(t, db, tg.Prefix+"hand_over"); n != 0 {
				t.Fatalf("version 5 has %d hand_over functions; want none", n)
			}
		}
		handsOffAfterUpgrade(t, tg, startUpgraded(t, tg, db))
		if tg.Dialect != cluster.Postgres {
			return
		}
		if n := functions(t, db, tg.Prefix+"hand_over"); n != 1 {
			t.Fatalf("%d hand_over functions after the upgrade; want one", n)
		}
		if n := functions(t, db, tg.Prefix+"release"); n != 1 {
			t.Fatalf("%d release functions after the upgrade; want the one of version 5", n)
		}
		// A member of version 5, running longest: named, not handed.
		if _, err := db.ExecContext(ctx, "INSERT INTO "+tg.Prefix+"nodes (scope, instance, node_id, host, pid, endpoint, started_at, last_seen, status, hears_releases) "+
			"VALUES ('leader', 'v5-1', 'v5', 'h', 1, '', 0, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'active', 1)"); err != nil {
			t.Fatal(err)
		}
		release := func(fn, cols string) (successor string, handed bool) {
			t.Helper()
			waitFor(t, 5*time.Second, "a node to hold the lease", func() bool {
				var n int
				err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+tg.Prefix+"lease WHERE name = 'leader' AND expires_at > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&n)
				return err == nil && n == 1
			})
			q := "SELECT " + cols + " FROM " + tg.Prefix + "lease l, " + tg.Prefix + fn + " r WHERE l.name = 'leader'"
			var err error
			if strings.Contains(cols, "handed") {
				err = db.QueryRowContext(ctx, q).Scan(&successor, &handed)
			} else {
				err = db.QueryRowContext(ctx, q).Scan(&successor)
			}
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return successor, handed
		}
		if successor, handed := release("hand_over('leader', l.holder, l.instance, NULL, 33)", "r.successor, r.handed"); successor != "v5-1" || handed {
			t.Fatalf("a release named %q, handed %v; want the version-5 member named, not handed", successor, handed)
		}
		// The version-5 function names this version's members too.
		if _, err := db.ExecContext(ctx, "UPDATE "+tg.Prefix+"nodes SET hears_releases = 2 WHERE instance = 'v5-1'"); err != nil {
			t.Fatal(err)
		}
		if successor, _ := release("release('leader', l.holder, l.instance, NULL)", "r.successor"); successor != "v5-1" {
			t.Fatalf("the version-5 release named %q; want v5-1, a member of version 6", successor)
		}
	})
}

// functions counts the functions named name in the current schema.
func functions(t *testing.T, db *sql.DB, name string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), "SELECT count(*) FROM pg_proc WHERE proname = $1 AND pronamespace = current_schema()::regnamespace", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// On PostgreSQL the schema transaction of an upgrade from version 4 takes
// no lock on the members table: New adds its new column in a transaction
// of its own first, and the schema file adds it only when it is missing.
// Locked there, after the lease table, it could deadlock with a running
// node's statement that locks the members table first (renew, acquire).
func TestSchemaUpgradeLeavesMembersUnlocked(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	db := tg.Open(t)
	createAtVersion(t, tg, db, 4)
	start(t, tg, "a") // upgrades
	var has bool
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'hears_releases' AND NOT attisdropped)", tg.Prefix+"nodes").Scan(&has); err != nil || !has {
		t.Fatalf("nodes has hears_releases after the upgrade: %v (%v)", has, err)
	}
	// The schema transaction again, as an upgrade runs it once the column
	// is there: which locks does it hold on the members table?
	ddl, err := cluster.SchemaSQL(cluster.Postgres, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, stmt := range splitSQL(ddl) {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("schema DDL: %v\n%s", err, stmt)
		}
	}
	var modes []string
	rows, err := tx.QueryContext(ctx, "SELECT mode FROM pg_locks WHERE pid = pg_backend_pid() AND relation = $1::regclass", tg.Prefix+"nodes")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			t.Fatal(err)
		}
		modes = append(modes, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, m := range modes {
		if m != "AccessShareLock" {
			t.Fatalf("the schema transaction holds %v on the members table; want at most AccessShareLock", modes)
		}
	}
}

// createAtVersion creates the cluster tables of schema version v in db,
// from testdata/schema_v<v>, records v, and runs each of rows.
func createAtVersion(t *testing.T, tg testdb.Target, db *sql.DB, v int, rows ...string) {
	t.Helper()
	ctx := context.Background()
	src, err := os.ReadFile(fmt.Sprintf("testdata/schema_v%d/%s.sql", v, tg.Dialect))
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range splitSQL(strings.ReplaceAll(string(src), "{{prefix}}", tg.Prefix)) {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("version %d DDL: %v\n%s", v, err, stmt)
		}
	}
	rows = append([]string{fmt.Sprintf("INSERT INTO %sschema_version (version, applied_at) VALUES (%d, 0)", tg.Prefix, v)}, rows...)
	for _, q := range rows {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}

// oldLease is a lease row of the old version: held by no node, expired,
// at token 7.
func oldLease(tg testdb.Target) string {
	return "INSERT INTO " + tg.Prefix + "lease (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint) VALUES ('leader', 'old', 'i', 7, 0, 0, 0, '')"
}

// startUpgraded starts node a, which upgrades the tables, and checks that
// its term goes on from oldLease's token and that this build's version is
// recorded.
func startUpgraded(t *testing.T, tg testdb.Target, db *sql.DB) *node {
	t.Helper()
	a := start(t, tg, "a")
	if got := a.FencingToken(); got != 8 {
		t.Fatalf("first term after the upgrade has token %d, want 8", got)
	}
	var version int
	if err := db.QueryRowContext(context.Background(), "SELECT MAX(version) FROM "+tg.Prefix+"schema_version").Scan(&version); err != nil || version != cluster.SchemaVersion {
		t.Fatalf("schema version after the upgrade = %d (%v), want %d", version, err, cluster.SchemaVersion)
	}
	return a
}

// handsOffAfterUpgrade checks that a, leading after the upgrade, hands
// the lease to b by Resign, under the next token. b is up before a
// resigns: started after, it could take longer to start than a's hold-off
// lasts (it did once in CI, on SQLite under -race), and a would lead again.
func handsOffAfterUpgrade(t *testing.T, tg testdb.Target, a *node) {
	t.Helper()
	b := start(t, tg, "b")
	if err := a.Resign(context.Background()); err != nil {
		t.Fatalf("release after the upgrade: %v", err)
	}
	waitFor(t, 5*time.Second, "b to lead after a resigned", b.IsLeader)
	if got := b.FencingToken(); got != 9 {
		t.Fatalf("b's term after a's has token %d, want 9", got)
	}
}

// On PostgreSQL the tables are found, and upgraded, in the schema that
// holds them, not in the first schema of the search_path: with tables of
// version 5 in schema x and a search_path "y, x", New upgrades x's tables
// (x's guards refuse a change of hands under one token afterwards) and
// creates nothing in y. The queries name x, so tables made in y would be
// a second, unused set, and x's would keep their old guards.
func TestSchemaUpgradeInTheTablesSchema(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	admin := tg.Open(t)
	x, y := tg.Prefix+"x", tg.Prefix+"y"
	for _, s := range []string{x, y} {
		if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.ExecContext(context.Background(), "DROP SCHEMA "+s+" CASCADE") })
	}
	inX := tg.OpenDSN(t, tg.DSN+"&search_path="+x)
	createAtVersion(t, tg, inX, 5, oldLease(tg))

	tgYX := tg
	tgYX.DSN = tg.DSN + "&search_path=" + y + "," + x
	a := start(t, tgYX, "a")
	if got := a.FencingToken(); got != 8 {
		t.Fatalf("first term after the upgrade has token %d, want 8", got)
	}
	var version, inY int
	if err := admin.QueryRowContext(ctx, "SELECT MAX(version) FROM "+x+"."+tg.Prefix+"schema_version").Scan(&version); err != nil || version != cluster.SchemaVersion {
		t.Fatalf("x's schema version after the upgrade = %d (%v), want %d", version, err, cluster.SchemaVersion)
	}
	if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", y).Scan(&inY); err != nil || inY != 0 {
		t.Fatalf("the upgrade made %d tables in %s (%v), want none", inY, y, err)
	}
	refusedWith(t, tg, admin, "SF009", cluster.ErrTokenLowered, "UPDATE "+x+"."+tg.Prefix+"lease SET holder = 'z', instance = 'zi'")
}
