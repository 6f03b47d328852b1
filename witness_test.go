package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// The witness file records every AdvanceTip, so a restore of the whole
// database (tips, high-water marks and table alike) to a point inside the
// current term is caught at the next boot; an AdvanceTip whose transaction
// rolled back is not mistaken for one.
func TestWitnessCatchesRestoreWithinTerm(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		dir := t.TempDir()
		witnessIn := func(name string) func(*cluster.Config) {
			return func(c *cluster.Config) { c.WitnessFile = filepath.Join(dir, name) }
		}
		db := tg.Open(t)
		table := createAuditTable(t, tg, db)

		// An AdvanceTip whose transaction rolled back is pending in the
		// witness, and is not mistaken for a restore at the next boot.
		a := startOn(t, tg, db, "a", withAudit(table), witnessIn("first.json"))
		appendAudit(t, tg, a, table, 1, 3)
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.AdvanceTip(ctx, tx, "audit", 4, hashOf(4, "a")); err != nil {
			t.Fatal(err)
		}
		tx.Rollback()
		a.Shutdown(ctx)
		startOn(t, tg, tg.Open(t), "a", withAudit(table), witnessIn("first.json")).Shutdown(ctx)

		// A term that begins at tip 3 (recorded at its acquisition) and
		// advances to 9; then the whole database goes back to tip 7, a point
		// inside that term, which only the AdvanceTip records can show.
		b := startOn(t, tg, tg.Open(t), "b", withAudit(table), witnessIn("second.json"))
		appendAudit(t, tg, b, table, 4, 9)
		b.Shutdown(ctx)
		restoreChain(t, tg, db, table, 7)
		cfg := tg.Config(t, tg.Open(t), "b")
		withAudit(table)(&cfg)
		witnessIn("second.json")(&cfg)
		if _, err := cluster.New(ctx, cfg); !errors.Is(err, cluster.ErrRollbackDetected) {
			t.Fatalf("New after a restore to a point inside the last term = %v, want ErrRollbackDetected", err)
		} else {
			t.Log(err)
		}
	})
}

// restoreChain puts the audit chain back to counter k as a restore of the
// whole database would: it removes the guard triggers, rewrites the rows
// they protect, and clears the schema version so the next New recreates
// the triggers.
func restoreChain(t *testing.T, tg testdb.Target, db *sql.DB, table string, k int) {
	t.Helper()
	ctx := context.Background()
	var list string
	switch tg.Dialect {
	case cluster.Postgres:
		list = "SELECT t.tgname || ' ON ' || c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal AND c.relname LIKE '" + tg.Prefix + "%'"
	case cluster.MySQL:
		list = "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME LIKE '" + tg.Prefix + "%'"
	case cluster.SQLite:
		list = "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE '" + tg.Prefix + "%'"
	}
	rows, err := db.QueryContext(ctx, list)
	if err != nil {
		t.Fatal(err)
	}
	var triggers []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		triggers = append(triggers, n)
	}
	rows.Close()
	if len(triggers) == 0 {
		t.Fatal("no triggers found to remove")
	}
	for _, n := range triggers {
		if _, err := db.ExecContext(ctx, "DROP TRIGGER "+n); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []struct {
		q    string
		args []any
	}{
		{"DELETE FROM " + table + " WHERE monotonic_counter > ?", []any{k}},
		{"UPDATE " + tg.Prefix + "chain_tips SET at_counter = ?, row_hash = ? WHERE scope = 'audit'", []any{k, hashOf(k, "a")}},
		{"UPDATE " + tg.Prefix + "high_water SET value = ? WHERE scope = 'chain/audit'", []any{k}},
		{"DELETE FROM " + tg.Prefix + "schema_version", nil},
	} {
		if _, err := db.ExecContext(ctx, bind(tg.Dialect, st.q), st.args...); err != nil {
			t.Fatalf("restore: %s: %v", st.q, err)
		}
	}
}
