package cluster

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// The cluster tables: the embedded schema files, the migration runner that
// creates or upgrades them at New, and the SQL an operator applies by hand.

// schemaFile reads an embedded schema file with {{prefix}} substituted.
// The prefix was validated against prefixPattern, so it is a plain
// identifier.
func schemaFile(name, prefix string) string {
	b, err := schemaFS.ReadFile("schema/" + name)
	if err != nil {
		panic("cluster: missing embedded schema/" + name) // a build defect, not input
	}
	return strings.ReplaceAll(string(b), "{{prefix}}", prefix)
}

// SchemaVersion is the version of the cluster tables this package writes.
// [New] refuses a database whose tables carry a newer version, and runs no
// DDL at all when they carry this one.
const SchemaVersion = 3

// schemaLockTimeout bounds how long schema changes wait for the cluster
// tables while a transaction (a fenced one, say) holds them.
const schemaLockTimeout = 5 * time.Second

//go:embed schema/*.sql
var schemaFS embed.FS

// Init checks the cluster tables and, only when they are missing or of an
// older schema version, creates or upgrades them under a lock that
// serializes nodes booting at once. It refuses a newer schema version.
// When the version is current it runs no DDL, so it works on a read-only
// replica and takes no lock that could queue behind an open transaction.
func (p *DBProvider) Init(ctx context.Context) error {
	return p.migrate(ctx, SchemaVersion, schemaFile(string(p.d.name())+".sql", p.prefix))
}

// migrate is Init for a build whose schema is version, with ddl the whole
// schema file of that version (the tests migrate to a synthetic next
// version this way).
func (p *DBProvider) migrate(ctx context.Context, version int64, ddl string) error {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	if err := p.d.prepare(ctx, conn, p); err != nil {
		return err
	}
	have, err := p.versionAtMost(ctx, conn, version)
	if err != nil || have == version {
		return err
	}
	unlock, err := p.d.lockSchema(ctx, conn, p.prefix)
	if err != nil {
		return p.wrap("lock schema", err)
	}
	err = p.applySchema(ctx, conn, version, ddl)
	if uerr := unlock(err == nil); err == nil && uerr != nil {
		err = p.wrap("unlock schema", uerr)
	}
	return err
}

// CheckSchema implements [provider.SchemaChecker]: it runs no DDL and returns an
// error wrapping [ErrSchema], saying what to run, unless the tables exist
// at this build's [SchemaVersion].
func (p *DBProvider) CheckSchema(ctx context.Context) error {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	if err := p.d.prepare(ctx, conn, p); err != nil {
		return err
	}
	have, err := p.schemaVersion(ctx, conn)
	if err != nil || have == SchemaVersion {
		return err
	}
	what := fmt.Sprintf("the cluster tables (prefix %q) are missing", p.prefix)
	if have > 0 {
		what = fmt.Sprintf("the cluster tables (prefix %q) are at schema version %d, not %d", p.prefix, have, SchemaVersion)
	}
	return fmt.Errorf("%w: %s and Config.SkipMigrations is set: apply cluster.SchemaSQL(%q, %q) with your migration tool, run `clusterctl migrate`, or start one node without SkipMigrations under a role with DDL rights",
		ErrSchema, what, p.d.name(), p.prefix)
}

// SchemaSQL returns the complete DDL of the cluster tables for dialect d
// and tablePrefix (empty means "cluster_"), for a DBA or a migration tool
// to apply, with [Config.SkipMigrations] set on the nodes. It is the DDL
// [New] runs: idempotent, and it records [SchemaVersion]. It applies as
// it is through the database's own client: psql (in one transaction with
// --single-transaction), sqlite3 (3.42 or later), and mysql, for which it
// sets the client's DELIMITER to // around the statements, because
// MySQL's trigger bodies contain semicolons. A tool that runs one
// statement at a time takes them as they end: at a line that starts in
// column 0 and ends with ";" (on MySQL with "//", between the DELIMITER
// lines).
func SchemaSQL(d Dialect, tablePrefix string) (string, error) {
	d = Dialect(strings.ToLower(string(d)))
	cfg, err := Config{NodeID: "-", Provider: &nopProvider{}, TablePrefix: tablePrefix}.resolve()
	if err != nil {
		return "", err
	}
	dl, err := newDialect(d, cfg.TablePrefix)
	if err != nil {
		return "", err
	}
	src := schemaFile(string(d)+".sql", cfg.TablePrefix)
	version := strings.Replace(dl.queries().VersionWrite, "$1", strconv.Itoa(SchemaVersion), 1)
	version = strings.Replace(strings.Replace(version, "?1", strconv.Itoa(SchemaVersion), 1), "?", strconv.Itoa(SchemaVersion), 1)
	src += "\n-- Records the schema version New checks.\n" + version + ";\n"
	if d == MySQL {
		src = withDelimiter(src, "//")
	}
	return src, nil
}

// withDelimiter rewrites a schema file for the mysql client: each
// statement ends with delim rather than ";" (the statement ends of
// splitStatements), between a DELIMITER delim line and a DELIMITER ;
// line, so that the semicolons inside trigger bodies stay in them.
func withDelimiter(src, delim string) string {
	var b strings.Builder
	b.WriteString("-- Apply with the mysql client: mysql DATABASE < this file. DELIMITER is the\n")
	b.WriteString("-- client's command; every statement below ends with " + delim + ".\n")
	b.WriteString("DELIMITER " + delim + "\n")
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if !strings.HasPrefix(trimmed, "--") && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") && strings.HasSuffix(trimmed, ";") {
			line = strings.TrimSuffix(strings.TrimRight(line, " \t\r\n"), ";") + delim + "\n"
		}
		b.WriteString(line)
	}
	b.WriteString("DELIMITER ;\n")
	return b.String()
}

// SchemaVersion reads the schema version the cluster tables record: 0
// when they are missing. It runs no DDL and takes no lock; a version newer
// than this build's [SchemaVersion] is returned with an error wrapping
// [ErrSchema]. For operators (clusterctl).
func (p *DBProvider) SchemaVersion(ctx context.Context) (int64, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	var have sql.NullInt64
	if err := conn.QueryRow(ctx, p.q.VersionRead).Scan(&have); err != nil {
		if errors.Is(p.wrap("", err), ErrSchema) {
			return 0, nil
		}
		return 0, p.wrap("read schema version", err)
	}
	if have.Int64 > SchemaVersion {
		return have.Int64, fmt.Errorf("%w: table %sschema_version records version %d, newer than the %d this build knows", ErrSchema, p.prefix, have.Int64, SchemaVersion)
	}
	return have.Int64, nil
}

// schemaVersion reads the recorded schema version without taking a lock:
// 0 when the tables are missing, an error wrapping ErrSchema when it is
// newer than this build.
func (p *DBProvider) schemaVersion(ctx context.Context, conn provider.Querier) (int64, error) {
	return p.versionAtMost(ctx, conn, SchemaVersion)
}

// versionAtMost is schemaVersion for a build whose schema is version.
func (p *DBProvider) versionAtMost(ctx context.Context, conn provider.Querier, version int64) (int64, error) {
	var have sql.NullInt64
	if err := conn.QueryRow(ctx, p.q.VersionRead).Scan(&have); err != nil {
		if errors.Is(p.wrap("", err), ErrSchema) {
			return 0, nil // no tables yet
		}
		return 0, p.wrap("read schema version", err)
	}
	if have.Int64 > version {
		return 0, fmt.Errorf("%w: table %sschema_version records version %d, newer than the %d this build knows; upgrade github.com/sqlfence/cluster",
			ErrSchema, p.prefix, have.Int64, version)
	}
	return have.Int64, nil
}

// applySchema creates or upgrades the tables; the caller holds the schema
// lock. The schema file is idempotent and describes the whole current
// schema, so it serves a new database and every older version alike.
func (p *DBProvider) applySchema(ctx context.Context, conn provider.Querier, version int64, file string) error {
	ddl := splitStatements(file)
	if ps, ok := p.d.(interface {
		pinSearchPath(ctx context.Context, conn provider.Querier) error
	}); ok {
		if err := ps.pinSearchPath(ctx, conn); err != nil {
			return p.wrap("set the search_path of the schema transaction", err)
		}
	}
	// The version table comes first so a newer schema is refused before we
	// touch anything else; another node may have upgraded while we waited
	// for the lock.
	if _, err := conn.Exec(ctx, ddl[0]); err != nil {
		return p.wrap("create schema_version table", err)
	}
	have, err := p.versionAtMost(ctx, conn, version)
	if err != nil || have == version {
		return err
	}
	for _, stmt := range ddl[1:] {
		if _, err := conn.Exec(ctx, stmt); err != nil && !p.d.ddlErrorOK(err) {
			return p.wrap(fmt.Sprintf("upgrade the cluster tables from schema version %d to %d", have, version), err)
		}
	}
	if _, err := conn.Exec(ctx, p.q.VersionWrite, version); err != nil {
		return p.wrap("record schema version", err)
	}
	if have > 0 {
		p.log.InfoContext(ctx, "cluster: upgraded the cluster tables", "from_version", have, "to_version", version)
	}
	return nil
}
