package testdb

import (
	"net/url"
	"testing"

	"github.com/sqlfence/cluster"
)

// EnvPgBouncer names a PgBouncer in transaction mode (pool_mode =
// transaction) in front of the PostgreSQL test database, as a plain DSN
// without pgx settings, such as
// postgres://postgres@127.0.0.1:6433/test?sslmode=disable.
const EnvPgBouncer = "CLUSTER_TEST_PGBOUNCER_DSN"

// PgBouncerSettings is the pgx setting PgBouncer targets use: with it
// every query goes out as one Parse, Bind, Execute, Sync on the unnamed
// statement, which PgBouncer runs on one server connection.
const PgBouncerSettings = "default_query_exec_mode=exec"

// A PgxSetting is pgx configuration in a DSN, and how the package fares
// with it through PgBouncer 1.18 in transaction mode.
type PgxSetting struct {
	Params string   // DSN parameters; empty is pgx's default, cache_statement
	Fails  []string // the errors it fails with, as substrings; none if it works
}

// PgxSettings are the pgx settings the PgBouncer tests try. Before 1.21,
// PgBouncer in transaction mode does not follow prepared statements: a
// statement prepared on one server connection is missing on the next one
// (SQLSTATE 26000) or already there under pgx's hashed name (42P05).
// describe_exec, which binds in a second round trip the unnamed statement
// it described in the first, is left out: the Bind can land on a server
// connection where another client's unnamed statement waits, and run that
// statement with its arguments, which could touch the tables of tests
// running at the same time through the same PgBouncer.
var PgxSettings = []PgxSetting{
	{Params: "", Fails: []string{"SQLSTATE 26000", "SQLSTATE 42P05"}},
	{Params: "statement_cache_capacity=0", Fails: []string{"cannot use QueryExecModeCacheStatement with disabled statement cache"}},
	{Params: "default_query_exec_mode=cache_describe"},
	{Params: "default_query_exec_mode=exec"},
	{Params: "default_query_exec_mode=simple_protocol"},
}

// PgBouncer returns a fresh PostgreSQL Target reached through the PgBouncer
// named by CLUSTER_TEST_PGBOUNCER_DSN, with PgBouncerSettings. It skips the
// test when the variable is unset (fails it under
// CLUSTER_TEST_REQUIRE_ALL). The tables the test creates are dropped,
// through PgBouncer, when it ends.
func PgBouncer(t testing.TB) Target {
	t.Helper()
	tg := Target{Dialect: cluster.Postgres, Driver: "pgx", DSN: dsn(t, EnvPgBouncer), Prefix: "t" + randomHex(6) + "_"}
	tg.DSN = tg.WithPgxSettings(t, PgBouncerSettings)
	t.Cleanup(func() { tg.drop(t) })
	return tg
}

// WithPgxSettings returns the PostgreSQL target's DSN with params, a URL
// query such as "default_query_exec_mode=exec", in place of the pgx
// settings it has.
func (tg Target) WithPgxSettings(t testing.TB, params string) string {
	t.Helper()
	u, err := url.Parse(tg.DSN)
	if err != nil || tg.Dialect != cluster.Postgres {
		t.Fatalf("testdb: %s target %q takes no pgx settings (%v)", tg.Dialect, tg.DSN, err)
	}
	add, err := url.ParseQuery(params)
	if err != nil {
		t.Fatalf("testdb: pgx settings %q: %v", params, err)
	}
	q := u.Query()
	for _, k := range []string{"default_query_exec_mode", "statement_cache_capacity", "description_cache_capacity"} {
		q.Del(k)
	}
	for k, vs := range add {
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	return u.String()
}
