package cluster_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

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

// Raw SQL that would lower, reuse or erase a fencing token or a chain tip
// is refused by the database with a distinct guard per rule, on every
// dialect; TRUNCATE, which MySQL cannot trap, is detected instead.
func TestGuardsRefuseTruncateReplaceAndRename(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		table := createAuditTable(t, tg, db)
		start(t, tg, "z").Shutdown(ctx) // tokens start above 1
		a := startOn(t, tg, db, "a", withAudit(table), slowRenew)
		appendAudit(t, tg, a, table, 1, 3)
		lease, tips, marks := tg.Prefix+"lease", tg.Prefix+"chain_tips", tg.Prefix+"high_water"
		token := a.FencingToken()

		refusedWith(t, tg, db, "SF001", cluster.ErrStaleFencingToken, "UPDATE "+tips+" SET at_counter = 4, fencing_token = fencing_token + 5")
		refusedWith(t, tg, db, "SF004", cluster.ErrLeaseDeleted, "UPDATE "+lease+" SET name = 'other'")
		refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "UPDATE "+lease+" SET fencing_token = 0")
		refusedWith(t, tg, db, "SF004", cluster.ErrLeaseDeleted, "DELETE FROM "+lease)
		refusedWith(t, tg, db, "SF003", cluster.ErrTipDeleted, "UPDATE "+tips+" SET scope = 'other'")
		refusedWith(t, tg, db, "SF003", cluster.ErrTipDeleted, "DELETE FROM "+tips)
		refusedWith(t, tg, db, "SF005", cluster.ErrTipRewritten, bind(tg.Dialect, "UPDATE "+tips+" SET row_hash = ?"), []byte("substitute"))
		refusedWith(t, tg, db, "SF002", cluster.ErrTipBackwards, "UPDATE "+tips+" SET at_counter = 2")
		refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "UPDATE "+marks+" SET value = 0")
		refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "DELETE FROM "+marks)
		// A tip keeps its lease: the application's role may insert a lease
		// row with any token, and a tip moved to it would be written under
		// a token no real term holds.
		if _, err := db.ExecContext(ctx, bind(tg.Dialect, "INSERT INTO "+lease+" (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint) VALUES ('forged', 'm', 'm', 1000000, 0, 0, ?, '')"), int64(1)<<50); err != nil {
			t.Fatalf("inserting a lease row of another name: %v", err)
		}
		refusedWith(t, tg, db, "SF003", cluster.ErrTipDeleted, "UPDATE "+tips+" SET lease_name = 'forged', fencing_token = 1000000, at_counter = at_counter + 1")

		switch tg.Dialect {
		case cluster.SQLite:
			// REPLACE deletes the row it replaces without firing delete
			// triggers: the insert guards compare with the high-water mark
			// and the row being replaced.
			refusedWith(t, tg, db, "SF007", cluster.ErrRollbackDetected,
				"INSERT OR REPLACE INTO "+lease+" (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint) VALUES ('leader', 'x', 'y', 1, 0, 0, 0, '')")
			refusedWith(t, tg, db, "SF002", cluster.ErrTipBackwards,
				"INSERT OR REPLACE INTO "+tips+" (scope, lease_name, at_counter, row_hash, fencing_token, updated_at) SELECT 'audit', 'leader', 1, x'01', fencing_token, 0 FROM "+lease)
			refusedWith(t, tg, db, "SF005", cluster.ErrTipRewritten,
				"REPLACE INTO "+tips+" (scope, lease_name, at_counter, row_hash, fencing_token, updated_at) SELECT 'audit', 'leader', 3, x'01', fencing_token, 0 FROM "+lease)
			refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "REPLACE INTO "+marks+" (scope, value) VALUES ('lease/leader', 0)")
		case cluster.Postgres:
			refusedWith(t, tg, db, "SF004", cluster.ErrLeaseDeleted, "TRUNCATE "+lease)
			refusedWith(t, tg, db, "SF003", cluster.ErrTipDeleted, "TRUNCATE "+tips)
			refusedWith(t, tg, db, "SF006", cluster.ErrTokenLowered, "TRUNCATE "+marks)
		case cluster.MySQL:
			// REPLACE deletes first, and the delete guard refuses that; a
			// lower token is refused before it comes to that.
			refusedWith(t, tg, db, "SF004", cluster.ErrLeaseDeleted,
				"REPLACE INTO "+lease+" (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint) SELECT 'leader', 'x', 'y', fencing_token + 5, 0, 0, 0, '' FROM "+lease)
			refusedWith(t, tg, db, "SF007", cluster.ErrRollbackDetected,
				"REPLACE INTO "+lease+" (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint) VALUES ('leader', 'x', 'y', 1, 0, 0, 0, '')")
			refusedWith(t, tg, db, "SF003", cluster.ErrTipDeleted,
				"REPLACE INTO "+tips+" (scope, lease_name, at_counter, row_hash, fencing_token, updated_at) SELECT 'audit', 'leader', 5, 'x', fencing_token, 0 FROM "+lease+" WHERE name = 'leader'")
			// Without a strict sql_mode, or under IGNORE, a NULL reaches the
			// triggers as NULL (no comparison with it holds) and would be
			// stored as 0; the guards refuse it first.
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, "SET SESSION sql_mode = ''"); err != nil {
				t.Fatal(err)
			}
			refusedWith(t, tg, conn, "SF006", cluster.ErrTokenLowered, "UPDATE IGNORE "+lease+" SET fencing_token = NULL, holder = 'z', instance = 'z' WHERE name = 'leader'")
			refusedWith(t, tg, conn, "SF006", cluster.ErrTokenLowered, "UPDATE "+lease+" SET fencing_token = NULL, expires_at = 0 WHERE name = 'leader'")
			refusedWith(t, tg, conn, "SF006", cluster.ErrTokenLowered, "UPDATE IGNORE "+marks+" SET value = NULL")
			refusedWith(t, tg, conn, "SF001", cluster.ErrStaleFencingToken, "UPDATE IGNORE "+tips+" SET at_counter = NULL, row_hash = NULL")
			refusedWith(t, tg, conn, "SF006", cluster.ErrTokenLowered, "INSERT IGNORE INTO "+marks+" (scope, value) VALUES ('lease/other', NULL)")
		}

		// Nothing above changed the token: a takeover gets the next one.
		a.Shutdown(ctx)
		b := startOn(t, tg, tg.Open(t), "b", withAudit(table))
		if got := b.FencingToken(); got != token+1 {
			t.Fatalf("after the refused statements the next term has token %d, want %d", got, token+1)
		}
		b.Shutdown(ctx)

		if tg.Dialect != cluster.MySQL {
			return
		}
		// MySQL cannot trap TRUNCATE (it needs the DROP privilege, which the
		// README says to withhold). A truncated tips table is detected at
		// boot against the high-water mark ...
		if _, err := db.ExecContext(ctx, "TRUNCATE "+tips); err != nil {
			t.Fatal(err)
		}
		cfg := tg.Config(t, tg.Open(t), "c")
		withAudit(table)(&cfg)
		if _, err := cluster.New(ctx, cfg); !errors.Is(err, cluster.ErrRollbackDetected) {
			t.Fatalf("New after TRUNCATE of the chain tips = %v, want ErrRollbackDetected", err)
		}
		// ... and a truncated lease table makes the next acquisition fail
		// with ErrRollbackDetected instead of granting token 1 again.
		if _, err := db.ExecContext(ctx, "TRUNCATE "+lease); err != nil {
			t.Fatal(err)
		}
		cfg = tg.Config(t, tg.Open(t), "d")
		if _, err := cluster.New(ctx, cfg); !errors.Is(err, cluster.ErrRollbackDetected) {
			t.Fatalf("New after TRUNCATE of the lease table = %v, want ErrRollbackDetected", err)
		}
		var got int64
		if err := db.QueryRowContext(ctx, "SELECT fencing_token FROM "+lease).Scan(&got); err != nil || got != 0 {
			t.Fatalf("after TRUNCATE the lease row has token %d (%v), want the free row at 0: no token was granted again", got, err)
		}
		// The documented repair: put the token back at its mark.
		var mark int64
		if err := db.QueryRowContext(ctx, "SELECT value FROM "+marks+" WHERE scope = 'lease/leader'").Scan(&mark); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "UPDATE "+lease+" SET fencing_token = ? WHERE name = 'leader'", mark); err != nil {
			t.Fatalf("repair: %v", err)
		}
		e := start(t, tg, "e")
		if got := e.FencingToken(); got != token+2 {
			t.Fatalf("after the repair the next term has token %d, want %d", got, token+2)
		}
	})
}

// A session's temporary table named like the lease table cannot make the
// chain-tip guard accept a made-up token on PostgreSQL and SQLite. On MySQL
// it can, for a role that may create temporary tables: New warns about
// such a role, and a role without the privilege cannot mount the attack.
func TestGuardIgnoresTemporaryLeaseTable(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		table := createAuditTable(t, tg, db)
		logs := &logRecorder{}
		a := startOn(t, tg, db, "a", withAudit(table), func(c *cluster.Config) { c.Logger = logs.logger(c.Logger) })
		appendAudit(t, tg, a, table, 1, 2)
		a.Shutdown(ctx) // nobody leads now

		attack := func(db *sql.DB) error {
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			temp := map[cluster.Dialect]string{
				cluster.Postgres: "CREATE TEMPORARY TABLE " + tg.Prefix + "lease (name TEXT, holder TEXT, instance TEXT, fencing_token BIGINT, acquired_at BIGINT, renewed_at BIGINT, expires_at BIGINT, endpoint TEXT)",
				cluster.MySQL:    "CREATE TEMPORARY TABLE " + tg.Prefix + "lease (name VARCHAR(128), holder VARCHAR(255), instance VARCHAR(64), fencing_token BIGINT, acquired_at BIGINT, renewed_at BIGINT, expires_at BIGINT, endpoint VARCHAR(255))",
				cluster.SQLite:   "CREATE TEMP TABLE " + tg.Prefix + "lease (name TEXT, holder TEXT, instance TEXT, fencing_token INTEGER, acquired_at INTEGER, renewed_at INTEGER, expires_at INTEGER, endpoint TEXT)",
			}[tg.Dialect]
			if _, err := conn.ExecContext(ctx, temp); err != nil {
				return err
			}
			if _, err := conn.ExecContext(ctx, "INSERT INTO "+tg.Prefix+"lease VALUES ('leader', 'mallory', 'm', 999, 0, 0, 9999999999999, '')"); err != nil {
				t.Fatal(err)
			}
			_, err = conn.ExecContext(ctx, "UPDATE "+tg.Prefix+"chain_tips SET at_counter = 3, fencing_token = 999")
			return err
		}

		err := attack(db)
		warned := logs.has("CREATE TEMPORARY TABLES")
		switch tg.Dialect {
		case cluster.Postgres, cluster.SQLite:
			if guardCode.FindString(fmtErr(err)) != "SF001" {
				t.Fatalf("chain tip under a temporary lease table's token = %v, want refused with SF001", err)
			}
			if warned {
				t.Error("warned about CREATE TEMPORARY TABLES on " + string(tg.Dialect))
			}
		case cluster.MySQL:
			// The documented hole: the statement is accepted.
			if err != nil {
				t.Fatalf("MySQL refused the attack (%v): the README and this test say it cannot; update both", err)
			}
			if !warned {
				t.Fatal("New did not warn that the role holds CREATE TEMPORARY TABLES")
			}
			// A role without the privilege cannot mount it, and New does not
			// warn for it.
			appDB := tg.OpenDSN(t, mysqlRole(t, tg, "SELECT, INSERT, UPDATE, DELETE"))
			logs := &logRecorder{}
			cfg := tg.Config(t, appDB, "app")
			cfg.Logger = logs.logger(cfg.Logger)
			c, err := cluster.New(ctx, cfg)
			if err != nil {
				t.Fatalf("New with an application role that has no DDL rights: %v", err)
			}
			c.Shutdown(ctx)
			if logs.has("CREATE TEMPORARY TABLES") {
				t.Error("warned about CREATE TEMPORARY TABLES for a role without it")
			}
			if err := attack(appDB); err == nil || !strings.Contains(err.Error(), "denied") {
				t.Fatalf("attack by a role without CREATE TEMPORARY TABLES = %v, want access denied", err)
			}
		}
	})
}

func fmtErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// An application role that does not own the cluster tables and holds only
// the rights the README lists can lead, fence and advance tips, and cannot
// remove or bypass the guards.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} { // SQLite has no roles
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			tg := testdb.New(t, d)
			ctx := context.Background()
			owner := tg.Open(t)
			table := createAuditTable(t, tg, owner)
			start(t, tg, "migrator", withAudit(table)).Shutdown(ctx) // creates the schema as the owner

			var dsn string
			if d == cluster.MySQL {
				dsn = mysqlRole(t, tg, "SELECT, INSERT, UPDATE")
			} else {
				dsn = postgresRole(t, tg, owner, "SELECT, INSERT, UPDATE")
			}
			app := tg.OpenDSN(t, dsn)
			a := startOn(t, tg, app, "a", withAudit(table), func(c *cluster.Config) { c.SkipMigrations = true })
			if !a.IsLeader() {
				t.Fatal("the application role does not lead")
			}
			appendAudit(t, tg, a, table, 1, 2)
			for _, q := range []string{
				"TRUNCATE " + tg.Prefix + "lease",
				"DROP TRIGGER " + map[cluster.Dialect]string{cluster.Postgres: tg.Prefix + "lease_guard ON " + tg.Prefix + "lease", cluster.MySQL: tg.Prefix + "lease_update_v1"}[d],
				"DROP TABLE " + tg.Prefix + "high_water",
			} {
				if _, err := app.ExecContext(ctx, q); err == nil || !(strings.Contains(err.Error(), "denied") || strings.Contains(err.Error(), "42501")) {
					t.Errorf("the application role ran %q: %v", q, err)
				}
			}
		})
	}
}

// A fencing token belongs to one holder. A statement that hands the lease
// or a lane to another holder or instance without raising the token (an
// application's UPDATE under its own role, say) is refused by the
// database on every dialect, so the node it names can never take up a
// term whose token another node held; naming no holder is allowed only
// once the term is over (an operator retiring the lease).
func TestTermCannotChangeHandsUnderOneToken(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		a := start(t, tg, "a")
		leaderOf(t, 5*time.Second, a)
		b := start(t, tg, "b")
		leaderOf(t, 5*time.Second, a, b)
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		token := a.FencingToken()
		if _, err := claimLane(ctx, a, "k"); err != nil {
			t.Fatal(err)
		}
		var instB string
		members, err := a.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			if m.NodeID == "b" {
				instB = m.Instance
			}
		}
		if instB == "" {
			t.Fatalf("b is not among the members %+v", members)
		}
		lease, lanes := tg.Prefix+"lease", tg.Prefix+"lanes"
		for _, q := range []string{
			"UPDATE " + lease + " SET holder = 'b', instance = ?",
			"UPDATE " + lease + " SET instance = ?",
			"UPDATE " + lease + " SET holder = 'b' WHERE instance <> ?",
			"UPDATE " + lease + " SET holder = '', instance = '' WHERE instance <> ?", // the term is not over
			"UPDATE " + lanes + " SET holder = 'b', instance = ?",
			"UPDATE " + lanes + " SET instance = ?",
			"UPDATE " + lanes + " SET holder = '', instance = '' WHERE instance <> ?",
		} {
			refusedWith(t, tg, db, "SF009", cluster.ErrTokenLowered, bind(tg.Dialect, q), instB)
		}
		if tg.Dialect == cluster.SQLite {
			// REPLACE deletes the row without firing the delete guard and
			// inserts one: the insert guard refuses a token already granted.
			refusedWith(t, tg, db, "SF009", cluster.ErrTokenLowered,
				"INSERT OR REPLACE INTO "+lease+" (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint) "+
					"SELECT name, 'b', ?, fencing_token, acquired_at, renewed_at, expires_at, endpoint FROM "+lease, instB)
			refusedWith(t, tg, db, "SF009", cluster.ErrTokenLowered,
				"INSERT OR REPLACE INTO "+lanes+" (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) "+
					"SELECT scope, lane, 'b', ?, fencing_token, acquired_at, renewed_at, expires_at FROM "+lanes, instB)
		}
		if tg.Dialect == cluster.MySQL {
			// REPLACE deletes first, which the delete guard refuses.
			refusedWith(t, tg, db, "SF004", cluster.ErrLeaseDeleted,
				"REPLACE INTO "+lease+" (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint) "+
					"SELECT name, 'b', ?, fencing_token, acquired_at, renewed_at, expires_at, endpoint FROM "+lease, instB)
		}
		time.Sleep(2 * testdb.Heartbeat)
		if !a.IsLeader() || b.IsLeader() || a.FencingToken() != token {
			t.Fatalf("after the refused statements a leads %v (token %d, want %d), b leads %v", a.IsLeader(), a.FencingToken(), token, b.IsLeader())
		}
		if owner, err := b.LaneOwner(ctx, "k"); err != nil || owner.Holder != "a" {
			t.Fatalf("lane k's owner = %+v, %v; want a", owner, err)
		}

		// Over, the term may name nobody: the token stays with the row,
		// and the next grant raises it.
		b.Shutdown(ctx)
		a.Shutdown(ctx)
		if _, err := db.ExecContext(ctx, "UPDATE "+lease+" SET holder = '', instance = '', endpoint = ''"); err != nil {
			t.Fatalf("naming no holder after the term: %v", err)
		}
		c := start(t, tg, "c")
		leaderOf(t, 5*time.Second, c)
		if got := c.FencingToken(); got != token+1 {
			t.Fatalf("the next term has token %d, want %d", got, token+1)
		}
	})
}

// shadowStatements make, on one database session, temporary copies of the
// cluster tables that say something else: the lease held by a ghost under
// a higher token for an hour, lane "k" the ghost's too, the config version
// at 1000, and no high-water marks. PostgreSQL and SQLite look temporary
// tables up before the schema's, so a statement of the package that names
// a table without its schema would read and write the copy on that
// session. now is the database clock in unix ms.
func shadowStatements(prefix, now string) []string {
	return []string{
		"CREATE TEMP TABLE " + prefix + "lease AS SELECT * FROM " + prefix + "lease",
		"UPDATE " + prefix + "lease SET holder = 'ghost', instance = 'ghost', fencing_token = fencing_token + 100, " +
			"renewed_at = " + now + ", expires_at = " + now + " + 3600000",
		"CREATE TEMP TABLE " + prefix + "lanes AS SELECT * FROM " + prefix + "lanes",
		"INSERT INTO " + prefix + "lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) " +
			"VALUES ('leader', 'k', 'ghost', 'ghost', 100, " + now + ", " + now + ", " + now + " + 3600000)",
		"CREATE TEMP TABLE " + prefix + "config AS SELECT * FROM " + prefix + "config",
		"INSERT INTO " + prefix + "config (scope, config_version, updated_at) VALUES ('leader', 1000, 0)",
		"CREATE TEMP TABLE " + prefix + "nodes AS SELECT * FROM " + prefix + "nodes WHERE 1 = 0",
		"CREATE TEMP TABLE " + prefix + "high_water AS SELECT * FROM " + prefix + "high_water WHERE 1 = 0",
	}
}

// A temporary table of the same name as a cluster table changes nothing:
// every statement reaches the real tables whatever the session holds. An
// application that shares a node's one-connection pool snapshots the
// tables into temporary tables (and edits the copies); the node still
// renews the real lease, so no other node takes it, reads the real leader,
// fences against the real row, claims lanes and reads and bumps the config
// version in the real tables. Before, its renews went to the copy, the
// real lease expired, and two nodes led and passed Fence at once.
// (MySQL looks temporary tables up first even in a qualified name: the
// README's caveat.)
func TestTemporaryTablesDoNotShadow(t *testing.T) {
	t.Parallel()
	for _, d := range []cluster.Dialect{cluster.SQLite, cluster.Postgres} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			tg := testdb.New(t, d)
			dbA := tg.Open(t)
			dbA.SetMaxOpenConns(1) // the application and the node share one session
			a := startOn(t, tg, dbA, "a")
			leaderOf(t, 5*time.Second, a)
			claimAndBump(t, a) // the lanes and config rows exist before the copies
			for _, q := range shadowStatements(tg.Prefix, dbNow(d)) {
				if _, err := dbA.ExecContext(context.Background(), q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			b := start(t, tg, "b")
			checkUnshadowed(t, a, b)
		})
	}
}

// Through PgBouncer in transaction mode a temporary table stays on the
// server connection of the client that made it, where the next client's
// transactions run: another client's copies of the cluster tables, left on
// every server connection, change nothing for the nodes.
func TestPgBouncerTemporaryTablesDoNotShadow(t *testing.T) {
	tg := testdb.PgBouncer(t)
	ctx := context.Background()
	if p, err := cluster.NewDBProvider(tg.Open(t), cluster.Postgres, tg.Prefix); err != nil {
		t.Fatal(err)
	} else if err := p.Init(ctx); err != nil {
		t.Fatal(err)
	}

	// Another client makes the copies on as many server connections as
	// PgBouncer gives it at once (each transaction holds one until it
	// ends), then ends its transactions: the copies stay there, and the
	// nodes started after run on those server connections.
	other := tg.Open(t)
	const sessions = 20 // the CI PgBouncer's default_pool_size
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	made := make(chan struct{}, sessions)
	done := make(chan struct{})
	for range sessions {
		wg.Go(func() {
			err := func() error {
				tx, err := other.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				for _, q := range shadowStatements(tg.Prefix, dbNow(cluster.Postgres)) {
					if _, err := tx.ExecContext(ctx, q); err != nil {
						return err
					}
				}
				made <- struct{}{}
				<-done // hold this server connection until all are made
				return tx.Commit()
			}()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				made <- struct{}{}
			}
		})
	}
	for range sessions {
		<-made
	}
	close(done)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("another client's copies: %v", err)
	}
	other.Close()
	a := start(t, tg, "a")
	leaderOf(t, 5*time.Second, a)
	claimAndBump(t, a)
	b := start(t, tg, "b")
	checkUnshadowed(t, a, b)
}

// claimAndBump makes lane "k" and the config row exist, and frees the lane.
func claimAndBump(t *testing.T, a *node) {
	t.Helper()
	ctx := context.Background()
	if _, err := claimLane(ctx, a, "k"); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseLane(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.BumpConfigVersion(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkUnshadowed checks that a, whose database sessions hold copies of
// the cluster tables (shadowStatements), still works on the real ones,
// with b beside it on sessions that hold none.
func checkUnshadowed(t *testing.T, a, b *node) {
	t.Helper()
	ctx := context.Background()
	watchSingleLeader(t, a, b)
	token := a.FencingToken()
	// Long enough for a lease renewed only in the copies to expire and b
	// to take it.
	time.Sleep(3 * testdb.LeaseTTL)
	if !a.IsLeader() || b.IsLeader() || a.FencingToken() != token {
		t.Fatalf("after the copies: a leads %v (token %d, was %d), b leads %v", a.IsLeader(), a.FencingToken(), token, b.IsLeader())
	}
	for _, n := range []*node{a, b} {
		l, err := n.CurrentLeader(ctx)
		if err != nil || l.NodeID != "a" || l.FencingToken != token {
			t.Fatalf("%s reads the leader %+v, %v; want a with token %d", n.NodeID(), l, err, token)
		}
	}

	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Fence(ctx, tx)
	tx.Rollback()
	if err != nil || got != token {
		t.Fatalf("a's Fence = %d, %v; want token %d", got, err, token)
	}

	lane, err := claimLane(ctx, a, "k")
	if err != nil || lane != 2 {
		t.Fatalf("a's claim of lane k = %d, %v; want token 2 (the copy says a ghost holds it with 100)", lane, err)
	}
	if owner, err := b.LaneOwner(ctx, "k"); err != nil || owner == nil || owner.Holder != "a" || owner.FencingToken != 2 {
		t.Fatalf("b reads lane k's owner %+v, %v; want a with token 2", owner, err)
	}

	if v, err := a.ConfigVersion(ctx); err != nil || v != 1 {
		t.Fatalf("a reads config version %d, %v; want 1 (the copy says 1000)", v, err)
	}
	if v, err := a.BumpConfigVersion(ctx); err != nil || v != 2 {
		t.Fatalf("a bumps the config version to %d, %v; want 2", v, err)
	}
	if v, err := b.ConfigVersion(ctx); err != nil || v != 2 {
		t.Fatalf("b reads config version %d, %v; want 2", v, err)
	}
}

// mysqlRole creates a MySQL user with privs on the test database, dropped
// when the test ends, and returns a DSN for it.
func mysqlRole(t *testing.T, tg testdb.Target, privs string) string {
	t.Helper()
	db := tg.Open(t)
	ctx := context.Background()
	user := strings.TrimSuffix(tg.Prefix, "_") + "_app"
	var schema string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw'",
		"GRANT " + privs + " ON `" + schema + "`.* TO '" + user + "'@'%'",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { db.ExecContext(context.Background(), "DROP USER IF EXISTS '"+user+"'@'%'") })
	return testdb.WithUser(t, tg, user, "pw")
}

// postgresRole creates a PostgreSQL login role with privs on the test's
// tables, dropped when the test ends, and returns a DSN for it.
func postgresRole(t *testing.T, tg testdb.Target, db *sql.DB, privs string) string {
	t.Helper()
	ctx := context.Background()
	role := strings.TrimSuffix(tg.Prefix, "_") + "_app"
	rows, err := db.QueryContext(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE $1", tg.Prefix+"%")
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		tables = append(tables, n)
	}
	rows.Close()
	if _, err := db.ExecContext(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'pw'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), "DROP OWNED BY "+role)
		db.ExecContext(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	if _, err := db.ExecContext(ctx, "GRANT "+privs+" ON "+strings.Join(tables, ", ")+" TO "+role); err != nil {
		t.Fatal(err)
	}
	return testdb.WithUser(t, tg, role, "pw")
}

func (unknownDriver) Open(string) (driver.Conn, error) { return nil, errors.New("not a real driver") }

// A wrapper counts renews and keeps every capability of the default
// provider, by embedding it (metered) or by delegating each method
// (delegating).
type wrapper interface {
	provider.Provider
	provider.Initializer
	RenewCount() int64
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

func (m *metered) RenewCount() int64 { return m.renews.Load() }

// wrappers are the two ways to wrap the default provider, by name.
var wrappers = map[string]func(*cluster.DBProvider) wrapper{
	"embedding":  func(p *cluster.DBProvider) wrapper { return &metered{DBProvider: p} },
	"delegating": func(p *cluster.DBProvider) wrapper { return &testdb.Delegating{P: p} },
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
			t.Run(name, func(t *testing.T) { testWrapped(t, tg, name, wrap) })
		}
	})
}

func testWrapped(t *testing.T, tg testdb.Target, name string, wrap func(*cluster.DBProvider) wrapper) {
	if name == "delegating" {
		// The suites and the wake-up for the delegating wrapper run in
		// providertest (TestDelegatingDBProvider); the capabilities below.
		testCapabilities(t, tg, wrap)
		return
	}
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
		testdb.ResignWakesSharer(t, tg, newWrapped(t, tg, wrap))
	})
	testCapabilities(t, tg, wrap)
}

// testCapabilities checks that Fence, chains, the witness and vault keys
// work through a wrapper.
func testCapabilities(t *testing.T, tg testdb.Target, wrap func(*cluster.DBProvider) wrapper) {
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
	if m.RenewCount() == 0 {
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

// Seen on an instance without a membership row wraps provider.ErrNotMember,
// the seam's sentinel, so that a node on any MemberStore joins again; a
// member that joined is seen without error.
func TestSeenWithoutRowIsErrNotMember(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		p := initProvider(t, tg, tg.Open(t))
		if err := p.Seen(ctx, "leader", "never-joined"); !errors.Is(err, provider.ErrNotMember) {
			t.Fatalf("Seen of an instance that never joined = %v, want provider.ErrNotMember", err)
		}
		if err := p.Join(ctx, "leader", cluster.Member{NodeID: "a", Instance: "a-1", Host: "h", PID: 1}); err != nil {
			t.Fatal(err)
		}
		if err := p.Seen(ctx, "leader", "a-1"); err != nil {
			t.Fatalf("Seen of a member = %v, want nil", err)
		}
	})
}

// The constructors refuse a missing pool with an error that names the
// argument, not a Config field the caller never used.
func TestProviderConstructorsRefuseNil(t *testing.T) {
	if _, err := cluster.NewDBProvider(nil, cluster.SQLite, ""); !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), "NewDBProvider needs a *sql.DB") {
		t.Errorf("NewDBProvider(nil) = %v, want ErrInvalidConfig naming the *sql.DB argument", err)
	}
	if _, err := cluster.NewSQLProvider(nil, cluster.SQLite, ""); !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), "NewSQLProvider needs a Pool") {
		t.Errorf("NewSQLProvider(nil) = %v, want ErrInvalidConfig naming the Pool argument", err)
	}
}
