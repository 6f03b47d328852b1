// Package testdb gives tests an isolated database of each dialect: a fresh
// SQLite file, or a unique table prefix in the PostgreSQL and MySQL
// databases named by CLUSTER_TEST_POSTGRES_DSN and CLUSTER_TEST_MYSQL_DSN.
//
// With CLUSTER_TEST_REQUIRE_ALL=1 a dialect whose DSN is missing fails the
// test instead of skipping it, so CI cannot pass while ignoring a dialect.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/sqlfence/cluster"
)

// Environment variables read by this package.
const (
	EnvPostgres   = "CLUSTER_TEST_POSTGRES_DSN"
	EnvMySQL      = "CLUSTER_TEST_MYSQL_DSN"
	EnvRequireAll = "CLUSTER_TEST_REQUIRE_ALL"
)

// Dialects lists every dialect, in the order tests run them.
var Dialects = []cluster.Dialect{cluster.SQLite, cluster.Postgres, cluster.MySQL}

// A Target is one isolated database: open as many pools on it as nodes.
type Target struct {
	Dialect cluster.Dialect
	Driver  string // database/sql driver name
	DSN     string
	Prefix  string // table prefix unique to the test
}

// ForEach runs f as a subtest for every dialect, each on a fresh Target.
func ForEach(t *testing.T, f func(t *testing.T, tg Target)) {
	t.Helper()
	for _, d := range Dialects {
		t.Run(string(d), func(t *testing.T) {
			f(t, New(t, d))
		})
	}
}

// New returns a fresh Target of dialect d, skipping the test when d is not
// configured (failing it under CLUSTER_TEST_REQUIRE_ALL). The tables the
// test creates are dropped when it ends.
func New(t testing.TB, d cluster.Dialect) Target {
	t.Helper()
	prefix := "t" + randomHex(6) + "_"
	switch d {
	case cluster.SQLite:
		path := filepath.Join(t.TempDir(), "cluster.db")
		return Target{Dialect: d, Driver: "sqlite", Prefix: prefix,
			DSN: "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"}
	case cluster.Postgres:
		tg := Target{Dialect: d, Driver: "pgx", DSN: dsn(t, EnvPostgres), Prefix: prefix}
		t.Cleanup(func() { tg.drop(t) })
		return tg
	case cluster.MySQL:
		tg := Target{Dialect: d, Driver: "mysql", DSN: dsn(t, EnvMySQL), Prefix: prefix}
		t.Cleanup(func() { tg.drop(t) })
		return tg
	}
	t.Fatalf("testdb: unknown dialect %q", d)
	return Target{}
}

func dsn(t testing.TB, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if os.Getenv(EnvRequireAll) != "" {
			t.Fatalf("testdb: %s is not set and %s requires every dialect", env, EnvRequireAll)
		}
		t.Skipf("testdb: %s is not set", env)
	}
	return v
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Open returns a new connection pool on the target, closed when the test
// ends.
func (tg Target) Open(t testing.TB) *sql.DB {
	t.Helper()
	return tg.OpenDSN(t, tg.DSN)
}

// OpenDSN is Open with another DSN for the same target, such as one that
// goes through a Proxy.
func (tg Target) OpenDSN(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(tg.Driver, dsn)
	if err != nil {
		t.Fatalf("testdb: open %s: %v", tg.Dialect, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Addr returns the host:port of a networked target.
func (tg Target) Addr(t testing.TB) string {
	t.Helper()
	switch tg.Dialect {
	case cluster.Postgres:
		u, err := url.Parse(tg.DSN)
		if err != nil {
			t.Fatalf("testdb: parse %s: %v", EnvPostgres, err)
		}
		return u.Host
	case cluster.MySQL:
		cfg, err := mysqldrv.ParseDSN(tg.DSN)
		if err != nil {
			t.Fatalf("testdb: parse %s: %v", EnvMySQL, err)
		}
		return cfg.Addr
	}
	t.Fatalf("testdb: %s has no address", tg.Dialect)
	return ""
}

// WithAddr returns the target's DSN pointing at addr instead.
func (tg Target) WithAddr(t testing.TB, addr string) string {
	t.Helper()
	switch tg.Dialect {
	case cluster.Postgres:
		u, _ := url.Parse(tg.DSN)
		u.Host = addr
		return u.String()
	case cluster.MySQL:
		cfg, _ := mysqldrv.ParseDSN(tg.DSN)
		cfg.Addr = addr
		return cfg.FormatDSN()
	}
	t.Fatalf("testdb: %s has no address", tg.Dialect)
	return ""
}

// Config returns a cluster configuration for node id on db with the test
// timings (LeaseTTL, Heartbeat, FenceTimeout), logging to t.
func (tg Target) Config(t testing.TB, db *sql.DB, id string) cluster.Config {
	return cluster.Config{
		NodeID:                id,
		DB:                    db,
		TablePrefix:           tg.Prefix,
		LeaseTTL:              LeaseTTL,
		HeartbeatInterval:     Heartbeat,
		FenceTimeout:          FenceTimeout,
		Endpoint:              "http://" + id + ".test:8080",
		AllowInsecureEndpoint: true,
		Logger:                Logger(t),
	}
}

// drop removes every table with the target's prefix.
func (tg Target) drop(t testing.TB) {
	db, err := sql.Open(tg.Driver, tg.DSN)
	if err != nil {
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE $1"
	if tg.Dialect == cluster.MySQL {
		q = "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?"
	}
	rows, err := db.QueryContext(ctx, q, tg.Prefix+"%")
	if err != nil {
		t.Logf("testdb: list tables to drop: %v", err)
		return
	}
	var names []string
	for rows.Next() {
		var n string
		if rows.Scan(&n) == nil && strings.HasPrefix(n, tg.Prefix) {
			names = append(names, n)
		}
	}
	rows.Close()
	for _, n := range names {
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+n); err != nil {
			t.Logf("testdb: drop %s: %v", n, err)
		}
	}
	if tg.Dialect == cluster.Postgres {
		// The guard functions outlive their tables.
		q := "SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = current_schema()::regnamespace AND proname LIKE $1"
		rows, err := db.QueryContext(ctx, q, tg.Prefix+"%")
		if err != nil {
			t.Logf("testdb: list functions to drop: %v", err)
			return
		}
		var funcs []string
		for rows.Next() {
			var f string
			if rows.Scan(&f) == nil {
				funcs = append(funcs, f)
			}
		}
		rows.Close()
		for _, f := range funcs {
			if _, err := db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+f); err != nil {
				t.Logf("testdb: drop %s: %v", f, err)
			}
		}
	}
}

// FreeAddr returns a loopback address nothing listens on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Name returns a short unique name for test nodes and leases.
func Name(prefix string) string { return fmt.Sprintf("%s-%s", prefix, randomHex(3)) }

// WithUser returns the target's DSN for another user of a networked
// target.
func WithUser(t testing.TB, tg Target, user, password string) string {
	t.Helper()
	switch tg.Dialect {
	case cluster.Postgres:
		u, _ := url.Parse(tg.DSN)
		u.User = url.UserPassword(user, password)
		return u.String()
	case cluster.MySQL:
		cfg, _ := mysqldrv.ParseDSN(tg.DSN)
		cfg.User, cfg.Passwd = user, password
		return cfg.FormatDSN()
	}
	t.Fatalf("testdb: %s has no users", tg.Dialect)
	return ""
}

// ReadOnlyDSN returns a DSN for the target on which every write fails, as
// on a read-only replica: default_transaction_read_only on PostgreSQL,
// tx_read_only on MySQL, mode=ro on SQLite.
func (tg Target) ReadOnlyDSN(t testing.TB) string {
	t.Helper()
	switch tg.Dialect {
	case cluster.Postgres:
		u, _ := url.Parse(tg.DSN)
		q := u.Query()
		q.Set("default_transaction_read_only", "on")
		u.RawQuery = q.Encode()
		return u.String()
	case cluster.MySQL:
		cfg, _ := mysqldrv.ParseDSN(tg.DSN)
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["tx_read_only"] = "1"
		return cfg.FormatDSN()
	}
	return tg.DSN + "&mode=ro"
}
