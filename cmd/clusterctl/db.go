package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqlfence/cluster"
)

// clockQueries read the database clock in unix milliseconds, as the
// library's own queries do (schema/*_queries.sql), so that time left and
// ages are measured by the clock that decides expiry. The library does not
// expose that clock.
var clockQueries = map[cluster.Dialect]string{
	cluster.Postgres: "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
	cluster.MySQL:    "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000",
	cluster.SQLite:   "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)",
}

// target resolves the dialect (from -dialect or the DSN's shape) and
// checks -prefix. needDSN is false for schema, which connects to nothing.
func (e *env) target(needDSN bool) error {
	if e.opts.dialect != "" {
		e.dialect = cluster.Dialect(strings.ToLower(e.opts.dialect)) // any case, as Config.Dialect
		if _, ok := drivers[e.dialect]; !ok {
			return usagef("-dialect %q: must be postgres, mysql or sqlite", e.opts.dialect)
		}
		if needDSN && e.opts.dsn == "" {
			return usagef("no database: set -dsn or $%s", EnvDSN)
		}
	} else {
		switch {
		case e.opts.dsn == "" && needDSN:
			return usagef("no database: set -dsn or $%s", EnvDSN)
		case e.opts.dsn == "":
			return usagef("no dialect: set -dialect postgres, mysql or sqlite (or -dsn, or $%s, to infer it from)", EnvDSN)
		}
		e.dialect = inferDialect(e.opts.dsn)
		if e.dialect == "" {
			return usagef("cannot tell the dialect from the DSN, which has none of the shapes %s; set -dialect postgres, mysql or sqlite", dialectHint)
		}
	}
	// SchemaSQL checks the prefix as Config.TablePrefix is checked.
	if _, err := cluster.SchemaSQL(e.dialect, e.opts.prefix); err != nil {
		return usagef("-prefix %q: %v", e.opts.prefix, err)
	}
	return nil
}

// connect opens the database and a provider over it. Unless the command
// creates the tables (migrate), it checks them first, and refuses to
// create a SQLite file that does not exist.
func (e *env) connect(ctx context.Context, creates bool) error {
	if err := e.target(true); err != nil {
		return err
	}
	dsn := e.opts.dsn
	if e.dialect == cluster.SQLite {
		if path, missing := sqliteMissing(dsn); missing && !creates {
			return fmt.Errorf("the SQLite database file %s does not exist: check -dsn, or run `clusterctl migrate` to create it with the cluster tables", path)
		}
		dsn = withBusyTimeout(dsn)
	}
	db, err := sql.Open(drivers[e.dialect], dsn)
	if err != nil {
		return fmt.Errorf("open the %s database: %w", e.dialect, err)
	}
	e.db = db
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("connect to the %s database: %w", e.dialect, err)
	}
	p, err := cluster.NewDBProvider(db, e.dialect, e.opts.prefix)
	if err != nil {
		return err
	}
	e.p = p
	if creates {
		return nil
	}
	return e.checkSchema(ctx)
}

// checkSchema returns nil when the cluster tables are current, and
// otherwise an error that says what to run.
func (e *env) checkSchema(ctx context.Context) error {
	err := e.p.CheckSchema(ctx)
	if err == nil || !errors.Is(err, cluster.ErrSchema) {
		return err
	}
	have, ok := e.schemaVersion(ctx)
	switch {
	case !ok || have == 0:
		return fmt.Errorf("the cluster tables (prefix %q) are missing from this %s database: run `clusterctl migrate` with the same -dsn and -prefix to create them",
			e.opts.prefix, e.dialect)
	case have < cluster.SchemaVersion:
		return fmt.Errorf("the cluster tables (prefix %q) are at schema version %d, older than the %d this clusterctl knows: run `clusterctl migrate` to upgrade them",
			e.opts.prefix, have, cluster.SchemaVersion)
	case have > cluster.SchemaVersion:
		return fmt.Errorf("the cluster tables (prefix %q) are at schema version %d, newer than the %d this clusterctl knows: use a clusterctl built with a newer github.com/sqlfence/cluster",
			e.opts.prefix, have, cluster.SchemaVersion)
	}
	return err
}

// schemaVersion reads the schema version the tables record; ok is false
// when it cannot be read (no tables). The library reports only whether it
// is current.
func (e *env) schemaVersion(ctx context.Context) (version int64, ok bool) {
	var v sql.NullInt64
	// The prefix was checked by target: a plain identifier.
	if err := e.db.QueryRowContext(ctx, "SELECT MAX(version) FROM "+e.opts.prefix+"schema_version").Scan(&v); err != nil {
		return 0, false
	}
	return v.Int64, true
}

// now reads the database clock.
func (e *env) now(ctx context.Context) (time.Time, error) {
	var ms int64
	if err := e.db.QueryRowContext(ctx, clockQueries[e.dialect]).Scan(&ms); err != nil {
		return time.Time{}, fmt.Errorf("read the database clock: %w", err)
	}
	return time.UnixMilli(ms), nil
}
