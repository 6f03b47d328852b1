package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/sqlfence/cluster"
)

// A target is the database of one experiment: its dialect, how the harness
// and the nodes reach it, and the tables of this run (all named with a
// prefix unique to the run).
type target struct {
	dialect cluster.Dialect
	driver  string
	dsn     string // the harness's own connection, direct
	prefix  string
}

// newTarget returns the target of dialect d. dsn is the server's DSN for
// PostgreSQL and MySQL, and the run directory for SQLite (whose nodes share
// one file on the local disk).
func newTarget(d cluster.Dialect, dsn, dir, prefix string) (target, error) {
	tg := target{dialect: d, prefix: prefix}
	switch d {
	case cluster.Postgres:
		tg.driver, tg.dsn = "pgx", dsn
	case cluster.MySQL:
		tg.driver, tg.dsn = "mysql", dsn
	case cluster.SQLite:
		tg.driver = "sqlite"
		tg.dsn = "file:" + filepath.Join(dir, "chaos.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	default:
		return tg, fmt.Errorf("unknown dialect %q", d)
	}
	return tg, nil
}

// writeLocked reports whether some session holds an SQLite database's
// write lock: a BEGIN IMMEDIATE that does not wait fails with SQLITE_BUSY.
// probe is a pool on the database file opened by openProbe.
func (tg target) writeLocked(ctx context.Context, probe *sql.DB) (bool, error) {
	tx, err := probe.BeginTx(ctx, nil)
	if err != nil {
		var se interface{ Code() int }
		if errors.As(err, &se) && se.Code()&0xff == 5 { // SQLITE_BUSY and its extended codes
			return true, nil
		}
		return false, err
	}
	return false, tx.Rollback()
}

// openProbe opens the pool writeLocked uses: SQLite's file with no busy
// wait, transactions beginning IMMEDIATE. Other dialects have none.
func (tg target) openProbe() (*sql.DB, error) {
	if tg.dialect != cluster.SQLite {
		return nil, nil
	}
	file, _, _ := strings.Cut(tg.dsn, "?")
	db, err := sql.Open(tg.driver, file+"?_pragma=busy_timeout(0)&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

// networked reports whether nodes reach the database over TCP (through
// their proxies).
func (tg target) networked() bool { return tg.dialect != cluster.SQLite }

// serverAddr is the host:port of a networked target.
func (tg target) serverAddr() (string, error) {
	switch tg.dialect {
	case cluster.Postgres:
		u, err := url.Parse(tg.dsn)
		if err != nil {
			return "", err
		}
		host := u.Host
		if _, _, err := net.SplitHostPort(host); err != nil {
			host = net.JoinHostPort(host, "5432")
		}
		return host, nil
	case cluster.MySQL:
		cfg, err := mysqldrv.ParseDSN(tg.dsn)
		if err != nil {
			return "", err
		}
		return cfg.Addr, nil
	}
	return "", fmt.Errorf("%s has no server address", tg.dialect)
}

// appName is the PostgreSQL application_name of node id's sessions, unique
// to the run, so a server-side kill touches only this run's node.
func (tg target) appName(id string) string { return "chaos_" + tg.prefix + id }

// nodeDSN is the DSN node id uses: through its proxy at addr, named so that
// the harness can find its sessions on the server.
func (tg target) nodeDSN(id, addr string) (string, error) {
	switch tg.dialect {
	case cluster.Postgres:
		u, err := url.Parse(tg.dsn)
		if err != nil {
			return "", err
		}
		u.Host = addr
		q := u.Query()
		q.Set("application_name", tg.appName(id))
		q.Set("connect_timeout", "5")
		u.RawQuery = q.Encode()
		return u.String(), nil
	case cluster.MySQL:
		cfg, err := mysqldrv.ParseDSN(tg.dsn)
		if err != nil {
			return "", err
		}
		cfg.Addr = addr
		cfg.Timeout = 5 * time.Second
		return cfg.FormatDSN(), nil
	}
	return tg.dsn, nil
}

func (tg target) open(dsn string) (*sql.DB, error) { return sql.Open(tg.driver, dsn) }

// bind rewrites ? placeholders as $n for PostgreSQL.
func bind(d cluster.Dialect, q string) string {
	if d != cluster.Postgres {
		return q
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

// Names of the workload's tables.
func (tg target) seqTable() string    { return tg.prefix + "seq" }
func (tg target) writesTable() string { return tg.prefix + "writes" }
func (tg target) auditTable() string  { return tg.prefix + "audit" }

// createWorkload creates the workload's tables: a one-row counter (the
// write sequence, the audit chain's counter and its last hash, locked by
// every write so that sequence order is commit order), the write log, and
// the hash-chained audit table.
func (tg target) createWorkload(ctx context.Context, db *sql.DB) error {
	bytes, integer, engine := "BYTEA", "BIGINT", ""
	switch tg.dialect {
	case cluster.MySQL:
		bytes, engine = "VARBINARY(64)", " ENGINE=InnoDB"
	case cluster.SQLite:
		bytes, integer = "BLOB", "INTEGER"
	}
	for _, q := range []string{
		"CREATE TABLE " + tg.seqTable() + " (id INTEGER PRIMARY KEY, n BIGINT NOT NULL, a BIGINT NOT NULL, h " + bytes + " NOT NULL)" + engine,
		"CREATE TABLE " + tg.writesTable() + " (seq " + integer + " PRIMARY KEY, token BIGINT NOT NULL, op VARCHAR(64) NOT NULL UNIQUE)" + engine,
		"CREATE TABLE " + tg.auditTable() + " (monotonic_counter " + integer + " PRIMARY KEY, row_hash " + bytes + " NOT NULL, payload VARCHAR(200) NOT NULL)" + engine,
		"CREATE TABLE " + tg.prefix + "lanewrites (seq " + integer + " PRIMARY KEY, lane VARCHAR(64) NOT NULL, token BIGINT NOT NULL, op VARCHAR(64) NOT NULL UNIQUE)" + engine,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	if _, err := db.ExecContext(ctx, bind(tg.dialect, "INSERT INTO "+tg.seqTable()+" (id, n, a, h) VALUES (1, 0, 0, ?)"), []byte{}); err != nil {
		return err
	}
	return tg.createTermLog(ctx, db)
}

// termsTable is the term log: one row per change of the lease row that
// begins or ends a term, numbered from the workload's counter.
func (tg target) termsTable() string { return tg.prefix + "terms" }

// createTermLog creates the term log and the triggers that fill it: each
// change of lease "leader", or of a lane of its scope, that grants a term
// or a claim (the token, the holder or the instance changes, or the row is
// created) or ends one early (a release: expires_at falls to renewed_at)
// takes the next number of the counter row the writes lock, in the same
// statement. Writes and term
// changes then share one order, decided by the database's locks at
// commit, not by client clocks: a write numbered after the grant of a
// higher token, or after its own term's release, committed when it must
// not have. Renewals change none of these columns and lock nothing more.
func (tg target) createTermLog(ctx context.Context, db *sql.DB) error {
	p, t, seq := tg.prefix, tg.termsTable(), tg.seqTable()
	boolean := "BOOLEAN"
	if tg.dialect == cluster.SQLite {
		boolean = "INTEGER"
	}
	qs := []string{"CREATE TABLE " + t + " (seq BIGINT PRIMARY KEY, lane VARCHAR(128) NOT NULL, token BIGINT NOT NULL, holder VARCHAR(255) NOT NULL, instance VARCHAR(64) NOT NULL, ended " + boolean + " NOT NULL)"}
	changed := "NEW.fencing_token <> OLD.fencing_token OR NEW.holder <> OLD.holder OR NEW.instance <> OLD.instance OR (NEW.expires_at <= NEW.renewed_at AND OLD.expires_at > OLD.renewed_at)"
	// Per table: its name, the condition that selects this run's rows, and
	// the lane column's value.
	tables := []struct{ name, mine, lane string }{
		{"lease", "NEW.name = 'leader'", "''"},
		{"lanes", "NEW.scope = 'leader'", "NEW.lane"},
	}
	for _, tb := range tables {
		ins := "INSERT INTO " + t + " (seq, lane, token, holder, instance, ended) "
		vals := tb.lane + ", NEW.fencing_token, NEW.holder, NEW.instance, NEW.expires_at <= NEW.renewed_at"
		trig := p + "log_" + tb.name
		switch tg.dialect {
		case cluster.Postgres:
			qs = append(qs, `CREATE FUNCTION `+trig+`() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE s bigint;
BEGIN
    IF `+tb.mine+` AND (TG_OP = 'INSERT' OR `+changed+`) THEN
        UPDATE `+seq+` SET n = n + 1 WHERE id = 1 RETURNING n INTO s;
        `+ins+`VALUES (s, `+vals+`);
    END IF;
    RETURN NULL;
END $$`,
				"CREATE TRIGGER "+trig+" AFTER INSERT OR UPDATE ON "+p+tb.name+" FOR EACH ROW EXECUTE FUNCTION "+trig+"()")
		case cluster.MySQL:
			body := func(cond string) string {
				return " FOR EACH ROW BEGIN IF " + tb.mine + cond + " THEN UPDATE " + seq + " SET n = n + 1 WHERE id = 1; " + ins + "SELECT n, " + vals + " FROM " + seq + " WHERE id = 1; END IF; END"
			}
			qs = append(qs, "CREATE TRIGGER "+trig+"_insert AFTER INSERT ON "+p+tb.name+body(""),
				"CREATE TRIGGER "+trig+"_update AFTER UPDATE ON "+p+tb.name+body(" AND ("+changed+")"))
		case cluster.SQLite:
			body := " BEGIN UPDATE " + seq + " SET n = n + 1 WHERE id = 1; " + ins + "SELECT n, " + vals + " FROM " + seq + " WHERE id = 1; END"
			qs = append(qs, "CREATE TRIGGER "+trig+"_insert AFTER INSERT ON "+p+tb.name+" FOR EACH ROW WHEN "+tb.mine+body,
				"CREATE TRIGGER "+trig+"_update AFTER UPDATE ON "+p+tb.name+" FOR EACH ROW WHEN "+tb.mine+" AND ("+changed+")"+body)
		}
	}
	for _, q := range qs {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// dropTipGuard drops the triggers that guard chain tips (the tip-guard
// mutant): a tip written under a stale token is then accepted.
func (tg target) dropTipGuard(ctx context.Context, db *sql.DB) error {
	var qs []string
	switch tg.dialect {
	case cluster.Postgres:
		qs = []string{"DROP TRIGGER " + tg.prefix + "chain_tips_guard ON " + tg.prefix + "chain_tips"}
	case cluster.MySQL:
		qs = []string{"DROP TRIGGER " + tg.prefix + "chain_tips_insert_v1", "DROP TRIGGER " + tg.prefix + "chain_tips_update_v1"}
	case cluster.SQLite:
		qs = []string{"DROP TRIGGER " + tg.prefix + "chain_tips_guard_insert", "DROP TRIGGER " + tg.prefix + "chain_tips_guard_update"}
	}
	for _, q := range qs {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// killSessions ends node id's sessions from the server side and returns how
// many it ended. Only this run's sessions are touched: on PostgreSQL those
// whose application_name is the node's (unique to the run), on MySQL those
// whose client port is one of the node's proxy's connections to the server.
func (tg target) killSessions(ctx context.Context, db *sql.DB, id string, ports map[int]bool) (int, error) {
	switch tg.dialect {
	case cluster.Postgres:
		var n int
		err := db.QueryRowContext(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
			tg.appName(id)).Scan(&n)
		return n, err
	case cluster.MySQL:
		rows, err := db.QueryContext(ctx, "SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()")
		if err != nil {
			return 0, err
		}
		var ids []int64
		for rows.Next() {
			var pid int64
			var host string
			if err := rows.Scan(&pid, &host); err != nil {
				rows.Close()
				return 0, err
			}
			h, p, err := net.SplitHostPort(host)
			if err != nil || (h != "127.0.0.1" && h != "localhost" && h != "::1") {
				continue
			}
			if port, err := strconv.Atoi(p); err == nil && ports[port] {
				ids = append(ids, pid)
			}
		}
		rows.Close()
		n := 0
		for _, pid := range ids {
			if _, err := db.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatInt(pid, 10)); err == nil {
				n++
			}
		}
		return n, nil
	}
	return 0, fmt.Errorf("%s has no server sessions", tg.dialect)
}

// drop removes every table (and on PostgreSQL every function) named with
// the run's prefix.
func (tg target) drop(ctx context.Context, db *sql.DB) error {
	if tg.dialect == cluster.SQLite {
		return nil // the file goes with the run directory
	}
	q := "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE $1"
	if tg.dialect == cluster.MySQL {
		q = "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?"
	}
	names, err := queryNames(ctx, db, q, tg.prefix+"%")
	if err != nil {
		return err
	}
	var firstErr error
	for _, n := range names {
		if !strings.HasPrefix(n, tg.prefix) {
			continue
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+n); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if tg.dialect == cluster.Postgres {
		funcs, err := queryNames(ctx, db, "SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = current_schema()::regnamespace AND proname LIKE $1", tg.prefix+"%")
		if err != nil {
			return err
		}
		for _, f := range funcs {
			if _, err := db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+f); err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	return firstErr
}

func queryNames(ctx context.Context, db *sql.DB, q string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// nowMillis is the dialect's expression for the database clock in unix
// milliseconds, as the library's queries write it.
func nowMillis(d cluster.Dialect) string {
	switch d {
	case cluster.Postgres:
		return "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
	case cluster.MySQL:
		return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
	}
	return "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
}

// tipUpsert writes a chain tip with raw SQL, as the library's tip_write
// does, but without the library's own check that this node still leads:
// only the database's guard triggers stand between it and a stale token.
func tipUpsert(d cluster.Dialect, prefix string) string {
	cols := "INSERT INTO " + prefix + "chain_tips (scope, lease_name, at_counter, row_hash, fencing_token, updated_at) VALUES (?, ?, ?, ?, ?, " + nowMillis(d) + ")"
	if d == cluster.MySQL {
		return cols + " ON DUPLICATE KEY UPDATE lease_name = VALUES(lease_name), at_counter = VALUES(at_counter), row_hash = VALUES(row_hash), fencing_token = VALUES(fencing_token), updated_at = VALUES(updated_at)"
	}
	return bind(d, cols+" ON CONFLICT (scope) DO UPDATE SET lease_name = excluded.lease_name, at_counter = excluded.at_counter, row_hash = excluded.row_hash, fencing_token = excluded.fencing_token, updated_at = excluded.updated_at")
}
