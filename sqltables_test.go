package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// bind rewrites ? placeholders for PostgreSQL.
func bind(d cluster.Dialect, q string) string {
	if d != cluster.Postgres {
		return q
	}
	out := make([]byte, 0, len(q)+8)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			out = append(out, '$')
			out = strconv.AppendInt(out, int64(n), 10)
			continue
		}
		out = append(out, q[i])
	}
	return string(out)
}

// leaseRow is the timing of the lease row.
type leaseRow struct{ renewed, expires int64 }

// readLease reads the timing of the lease row.
func readLease(t *testing.T, tg testdb.Target, db *sql.DB) leaseRow {
	t.Helper()
	var r leaseRow
	if err := db.QueryRow("SELECT renewed_at, expires_at FROM "+tg.Prefix+"lease").Scan(&r.renewed, &r.expires); err != nil {
		t.Fatal(err)
	}
	return r
}

// afterRenew returns just after the lease row was renewed.
func afterRenew(t *testing.T, tg testdb.Target, db *sql.DB) {
	t.Helper()
	before := readLease(t, tg, db)
	waitFor(t, 5*time.Second, "a renew", func() bool { return readLease(t, tg, db).renewed != before.renewed })
}

// expireLease ends the current term in the database, as the passing of its
// TTL would while its holder is paused.
func expireLease(t *testing.T, tg testdb.Target, db *sql.DB) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), "UPDATE "+tg.Prefix+"lease SET expires_at = 0"); err != nil {
		t.Fatal(err)
	}
}

// createAuditTable creates a hash-chained table <prefix>audit with the
// default column names.
func createAuditTable(t *testing.T, tg testdb.Target, db *sql.DB) string {
	t.Helper()
	name := tg.Prefix + "audit"
	ddl := map[cluster.Dialect]string{
		cluster.Postgres: "CREATE TABLE " + name + " (monotonic_counter BIGINT PRIMARY KEY, row_hash BYTEA NOT NULL, payload TEXT NOT NULL)",
		cluster.MySQL:    "CREATE TABLE " + name + " (monotonic_counter BIGINT PRIMARY KEY, row_hash VARBINARY(64) NOT NULL, payload TEXT NOT NULL) ENGINE=InnoDB",
		cluster.SQLite:   "CREATE TABLE " + name + " (monotonic_counter INTEGER PRIMARY KEY, row_hash BLOB NOT NULL, payload TEXT NOT NULL)",
	}[tg.Dialect]
	if _, err := db.ExecContext(context.Background(), ddl); err != nil {
		t.Fatal(err)
	}
	return name
}

// hashOf is a stand-in row hash for counter n.
func hashOf(n int, salt string) []byte {
	return []byte{byte(n >> 8), byte(n), 0xfe, salt[0], 0x01, 0x02, 0x03, 0x04, 0x05}
}

// appendAudit appends rows from..to to the audit table through n, each in
// a fenced transaction that advances the chain's tip.
func appendAudit(t *testing.T, tg testdb.Target, n *node, table string, from, to int) {
	t.Helper()
	appendAuditSalted(t, tg, n, table, from, to, "a")
}

// appendAuditSalted is appendAudit with rows whose hashes differ from
// another salt's at the same counters: another history.
func appendAuditSalted(t *testing.T, tg testdb.Target, n *node, table string, from, to int, salt string) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := auditRow(context.Background(), tg, n, table, i, salt); err != nil {
			t.Fatal(err)
		}
	}
}

// auditRow appends row i to the audit table through n in a fenced
// transaction that advances the chain's tip.
func auditRow(ctx context.Context, tg testdb.Target, n *node, table string, i int, salt string) error {
	tx, err := n.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := n.Fence(ctx, tx); err != nil {
		return fmt.Errorf("Fence: %w", err)
	}
	h := hashOf(i, salt)
	if _, err := tx.ExecContext(ctx, bind(tg.Dialect, "INSERT INTO "+table+" (monotonic_counter, row_hash, payload) VALUES (?, ?, ?)"), i, h, "event"); err != nil {
		return err
	}
	if err := n.AdvanceTip(ctx, tx, "audit", uint64(i), h); err != nil {
		return fmt.Errorf("AdvanceTip(%d): %w", i, err)
	}
	return tx.Commit()
}

// auditLeader creates the audit table and starts node "a" over it, which
// appends rows 1..rows. It returns a's pool, the table and a.
func auditLeader(t *testing.T, tg testdb.Target, rows int) (*sql.DB, string, *node) {
	t.Helper()
	db := tg.Open(t)
	table := createAuditTable(t, tg, db)
	a := startOn(t, tg, db, "a", withAudit(table))
	appendAudit(t, tg, a, table, 1, rows)
	return db, table, a
}

// withAudit configures the audit chain.
func withAudit(table string) func(*cluster.Config) {
	return func(c *cluster.Config) {
		c.Chains = []cluster.Chain{{Name: "audit", Table: table}}
	}
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

// deleteOnAcquire installs a trigger that deletes the row at counter from
// the chain table whenever the lease row changes, so an acquisition finds
// the chain rolled back although the check at boot passed.
func deleteOnAcquire(t *testing.T, tg testdb.Target, db *sql.DB, table string, counter int) {
	t.Helper()
	ctx := context.Background()
	name := tg.Prefix + "delete_on_acquire"
	del := "DELETE FROM " + table + " WHERE monotonic_counter = " + strconv.Itoa(counter)
	var stmts []string
	switch tg.Dialect {
	case cluster.SQLite:
		stmts = []string{"CREATE TRIGGER " + name + " AFTER UPDATE ON " + tg.Prefix + "lease BEGIN " + del + "; END"}
	case cluster.MySQL:
		stmts = []string{"CREATE TRIGGER " + name + " AFTER UPDATE ON " + tg.Prefix + "lease FOR EACH ROW " + del}
	case cluster.Postgres:
		stmts = []string{
			"CREATE FUNCTION " + name + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN " + del + "; RETURN NULL; END $$",
			"CREATE TRIGGER " + name + " AFTER UPDATE ON " + tg.Prefix + "lease FOR EACH ROW EXECUTE FUNCTION " + name + "()",
		}
		t.Cleanup(func() { db.ExecContext(context.Background(), "DROP FUNCTION IF EXISTS "+name+"() CASCADE") })
	}
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}

// createWriteLog creates <prefix>seq, a one-row counter, and <prefix>writes,
// where fencedWrite appends (seq, token, node) rows.
func createWriteLog(t *testing.T, tg testdb.Target, db *sql.DB) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE " + tg.Prefix + "seq (id INTEGER PRIMARY KEY, n BIGINT NOT NULL)",
		"INSERT INTO " + tg.Prefix + "seq (id, n) VALUES (1, 0)",
		"CREATE TABLE " + tg.Prefix + "writes (seq BIGINT PRIMARY KEY, token BIGINT NOT NULL, node VARCHAR(16) NOT NULL)",
	} {
		if _, err := db.ExecContext(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
}

// fencedWrite appends one row to the write log in a transaction fenced by
// fence. The row's seq comes from the locked counter row, so seq order is
// commit order; its token is the one fence verified.
func fencedWrite(ctx context.Context, db *sql.DB, fence func(context.Context, cluster.Tx) (uint64, error), d cluster.Dialect, prefix, node string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	token, err := fence(ctx, tx)
	if err != nil {
		return err
	}
	lock := " FOR UPDATE"
	if d == cluster.SQLite {
		lock = "" // the write transaction is already exclusive
	}
	var s int64
	if err := tx.QueryRowContext(ctx, "SELECT n FROM "+prefix+"seq WHERE id = 1"+lock).Scan(&s); err != nil {
		return err
	}
	s++
	if _, err := tx.ExecContext(ctx, bind(d, "UPDATE "+prefix+"seq SET n = ? WHERE id = 1"), s); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, bind(d, "INSERT INTO "+prefix+"writes (seq, token, node) VALUES (?, ?, ?)"), s, token, node); err != nil {
		return err
	}
	return tx.Commit()
}

// writeLog is a row of the write log.
type writeLog struct {
	seq, token int64
	node       string
}

// readWriteLog returns the write log in commit order, failing the test if
// a token ever decreases along it.
func readWriteLog(t *testing.T, tg testdb.Target, db *sql.DB) []writeLog {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), "SELECT seq, token, node FROM "+tg.Prefix+"writes ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []writeLog
	for rows.Next() {
		var w writeLog
		if err := rows.Scan(&w.seq, &w.token, &w.node); err != nil {
			t.Fatal(err)
		}
		if n := len(out); n > 0 && w.token < out[n-1].token {
			t.Fatalf("commit %d by %s has token %d after commit %d with token %d", w.seq, w.node, w.token, out[n-1].seq, out[n-1].token)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// beginImmediate takes SQLite's write lock on db until the transaction
// ends.
func beginImmediate(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil) // the test DSN uses _txlock=immediate
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// newerSchema makes the target's tables carry a schema version newer than
// this build's, so New fails with ErrSchema, and returns the undo.
func newerSchema(t *testing.T, tg testdb.Target, db *sql.DB) (undo func()) {
	t.Helper()
	ctx := context.Background()
	table := tg.Prefix + "schema_version"
	for _, q := range []string{
		"CREATE TABLE " + table + " (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
		"INSERT INTO " + table + " (version, applied_at) VALUES (999, 0)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		if _, err := db.ExecContext(ctx, "DELETE FROM "+table); err != nil {
			t.Fatal(err)
		}
	}
}

var guardCode = regexp.MustCompile(`SF\d{3}`)

// refusedWith runs q and fails the test unless a guard refuses it with
// SQLSTATE code, which must classify as the sentinel want.
func refusedWith(t *testing.T, tg testdb.Target, q sqlRunner, code string, want error, query string, args ...any) {
	t.Helper()
	_, err := q.ExecContext(context.Background(), query, args...)
	if err == nil {
		t.Errorf("accepted, want refusal %s: %s", code, query)
		return
	}
	if got := guardCode.FindString(err.Error()); got != code {
		t.Errorf("refused with %v, want guard %s: %s", err, code, query)
		return
	}
	if got := cluster.ClassifyDBError(tg.Dialect, err); !errors.Is(got, want) {
		t.Errorf("guard %s classifies as %v, want %v", code, got, want)
	}
}

type sqlRunner interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}
