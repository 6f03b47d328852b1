package cluster

import (
	"context"
	"database/sql"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// Hooks for the external tests (package cluster_test).

// MonoAfter is monoAfter, the saturating sum behind every deadline on the
// monotonic clock.
var MonoAfter = monoAfter

// ResolveConfig returns c with its defaults applied, as New uses it.
func ResolveConfig(c Config) (Config, error) { return c.resolve() }

// ResetDefault forgets the default instance, as if Init had never been
// called. The tests of the package-level functions share it, so they run
// one at a time and reset it before and after; no Init may be under way.
func ResetDefault() {
	std.mu.Lock()
	defer std.mu.Unlock()
	setState(nil) // also ends single-node work
	std.notify, std.observe = nil, nil
	std.init = nil
}

// LocalWatchers reports how many nodes watch the releases of lease name
// through p.
func LocalWatchers(p *DBProvider, name string) int {
	p.watchers.mu.Lock()
	defer p.watchers.mu.Unlock()
	return len(p.watchers.m[name])
}

// FenceQuery returns the text of the fence read that the provider c built
// over Config.DB prepared for c's LeaseTTL (from c's first Fence on),
// waiting for a preparation under way; "" when it has none.
func FenceQuery(c *Cluster) string {
	if c.own == nil {
		return ""
	}
	c.own.preparing.Wait()
	c.own.fenceMu.Lock()
	defer c.own.fenceMu.Unlock()
	f := c.own.fences[c.cfg.LeaseTTL]
	if f == nil {
		return ""
	}
	d := c.own.d.(interface {
		fenceQuery(ttl, limit time.Duration) string
	})
	q := d.fenceQuery(c.cfg.LeaseTTL, c.cfg.LeaseTTL) // the text of a context without a deadline
	if f.stmts[q] == nil {
		return ""
	}
	return q
}

// RowCheckEvery sets how often a PostgreSQL candidate checks that its
// membership row is its own (hourly by default).
func RowCheckEvery(d time.Duration) func(*Config) {
	return func(c *Config) { c.opts.rowCheckEvery = d }
}

// TxQuerier is the package's Querier over a database/sql transaction.
func TxQuerier(tx *sql.Tx) provider.Querier { return sqlQuerier{tx} }

// MigrateTo runs p's migration for a build whose schema is version, with
// ddl its whole schema file: the path of the next real schema change.
func MigrateTo(ctx context.Context, p *DBProvider, version int64, ddl string) error {
	return p.migrate(ctx, version, ddl)
}

// SchemaDDL is the schema file New runs for dialect d, with tablePrefix:
// SchemaSQL without the version record and, on MySQL, without the mysql
// client's DELIMITER lines.
func SchemaDDL(d Dialect, tablePrefix string) string {
	return schemaFile(string(d)+".sql", tablePrefix)
}

// ClassifyDBError maps a driver error of dialect d to the package's
// sentinels, as the default provider does, for tests that trip the guard
// triggers with raw SQL.
func ClassifyDBError(d Dialect, err error) error {
	dl, _ := newDialect(d, DefaultTablePrefix)
	return (&DBProvider{d: dl}).wrap("raw SQL", err)
}
