package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// postgres is the PostgreSQL dialect (12 or later), through pgx's
// database/sql driver or pgx itself: single-statement lease operations
// with RETURNING, expiry by clock_timestamp(), transactional DDL under an
// advisory lock. pgx cancels a statement on the server when its context
// ends, so lease statements need no other bound.
type postgres struct {
	prefix   string
	scratch  string // the warm-up's scratch lease name ends with it
	warmFlag string // the session setting the warm query sets
	// schemaMu guards schema, the schema the queries name their tables
	// in, set once by prepare ("" before: unqualified).
	schemaMu sync.Mutex
	schema   string
	q        struct {
		queries
		CurrentSchema string `sql:"current_schema"` // lease table
		SchemaLock    string `sql:"schema_lock"`    // lock key, lock timeout ms
		Warm          string `sql:"warm"`           // (none)
		Poll          string `sql:"poll"`           // name, instance
		pgLaneQueries
	}
}

func newPostgres(prefix string) dialect {
	d := &postgres{prefix: prefix, scratch: newInstanceID(), warmFlag: "sqlfence." + prefix + "warm"}
	d.load("")
	return d
}

// load fills d's queries, their tables qualified by schema (quoted, with
// its dot; "" for none).
func (d *postgres) load(schema string) {
	loadQueries("postgres_queries.sql", queryFile("postgres_queries.sql", d.prefix, schema), &d.q)
	if strings.Contains(d.q.Acquire, "$grant$") || !strings.Contains(d.q.Warm, "{{acquire}}") {
		panic("cluster: schema/postgres_queries.sql: the warm query cannot quote the acquire query") // a build defect
	}
	d.q.Warm = strings.NewReplacer("{{acquire}}", d.q.Acquire, "{{scratch}}", d.scratch).Replace(d.q.Warm)
}

// quoteIdent quotes a PostgreSQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func (d *postgres) name() Dialect     { return Postgres }
func (d *postgres) queries() *queries { return &d.q.queries }

// prepare resolves the schema of the cluster tables, the first time it
// runs, and qualifies every statement's tables with it: a temporary table
// of the same name on a session (the application's, or another client's
// left on a pooler's server connection) would otherwise stand in for the
// lease, and the node would renew and fence a copy. It fails when there
// is no schema to create the tables in; the schema file pins the same
// schema, with pg_temp after it, into the guard functions.
func (d *postgres) prepare(ctx context.Context, conn provider.Querier, p *DBProvider) error {
	d.schemaMu.Lock()
	defer d.schemaMu.Unlock()
	if d.schema != "" {
		return nil
	}
	var cur sql.NullString
	var n int64
	var found string
	if err := conn.QueryRow(ctx, d.q.CurrentSchema, d.prefix+"lease").Scan(&cur, &n, &found); err != nil {
		return p.wrap("read current schema", err)
	}
	if !cur.Valid {
		return fmt.Errorf("%w: PostgreSQL has no current schema to create the cluster tables in: set search_path for the role or in the DSN", ErrSchema)
	}
	if n > 1 {
		return fmt.Errorf("%w: table %slease is in more than one schema of the search_path (%s), and nodes started with different search_paths, or before and after one was created, would campaign for different leases: drop the stray tables, and withhold CREATE on schemas before the cluster tables' schema from the application's role",
			ErrSchema, d.prefix, found)
	}
	d.schema = cur.String
	d.load(quoteIdent(d.schema) + ".")
	return nil
}

// pinSearchPath makes the schema prepare resolved the first of conn's
// search_path for the rest of its transaction, pg_temp after it, before
// the schema file runs there: the file creates its tables in
// current_schema() and pins it into the guard functions, and it must be
// the schema the queries name (tables found further down the
// search_path would otherwise be left behind, unguarded, and a second
// set created).
func (d *postgres) pinSearchPath(ctx context.Context, conn provider.Querier) error {
	d.schemaMu.Lock()
	schema := d.schema
	d.schemaMu.Unlock()
	if schema == "" {
		return nil
	}
	_, err := conn.Exec(ctx, "SELECT set_config('search_path', $1, true)", quoteIdent(schema)+", pg_temp")
	return err
}

func (d *postgres) lockSchema(ctx context.Context, conn provider.Querier, prefix string) (func(bool) error, error) {
	background := context.WithoutCancel(ctx)
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, d.q.SchemaLock, "sqlfence/cluster schema "+prefix,
		strconv.FormatInt(schemaLockTimeout.Milliseconds(), 10)); err != nil {
		conn.Exec(background, "ROLLBACK")
		return nil, err
	}
	return func(ok bool) error { return endTx(background, conn, ok) }, nil
}

func (d *postgres) ddlErrorOK(error) bool { return false }

func (d *postgres) acquire(ctx context.Context, conn provider.Querier, req provider.LeaseRequest) (bool, row, error) {
	var r row
	var granted, warm bool
	err := conn.QueryRow(ctx, d.q.Acquire, req.Holder, req.Instance, req.TTL.Milliseconds(), req.Endpoint, req.Name).
		Scan(&granted, &r.holder, &r.instance, &r.token, &r.expiresAt, &r.endpoint, &r.now, &warm)
	r.cold = err == nil && !warm
	if errors.Is(err, sql.ErrNoRows) {
		// The row was created concurrently after our snapshot: read who
		// holds it now.
		return false, r, r.scan(conn.QueryRow(ctx, d.q.Leader, req.Name))
	}
	return granted, r, err
}

// poll reads the lease row for a follower's routine attempt
// (LeaseRequest.Poll), refreshing its membership as an attempt does.
func (d *postgres) poll(ctx context.Context, conn provider.Querier, req provider.LeaseRequest) (row, error) {
	var r row
	err := r.scan(conn.QueryRow(ctx, d.q.Poll, req.Name, req.Instance))
	return r, err
}

// warm prepares conn's database session for its first grant (the warm
// query), after an acquisition on it was refused.
func (d *postgres) warm(ctx context.Context, conn provider.Querier) error {
	_, err := conn.Exec(ctx, d.q.Warm)
	return err
}

func (d *postgres) renew(ctx context.Context, conn provider.Querier, l provider.Lease, ttl time.Duration) (int64, error) {
	var expires int64
	err := conn.QueryRow(ctx, d.q.Renew, ttl.Milliseconds(), l.Name, l.Holder, l.Instance, int64(l.FencingToken)).Scan(&expires)
	return expires, err
}

func (d *postgres) bound(q string, _ time.Duration) string { return q }

func (d *postgres) fence(ctx context.Context, tx provider.Querier, name string, ttl, _ time.Duration) (row, error) {
	var r row
	err := r.scan(tx.QueryRow(ctx, d.q.Fence, name, strconv.FormatInt(ttl.Milliseconds(), 10)))
	return r, err
}

func (d *postgres) classify(err error) (kind error, hint, guard string) {
	var pg interface{ SQLState() string }
	if !errors.As(err, &pg) {
		return nil, "", ""
	}
	switch code := pg.SQLState(); {
	case strings.HasPrefix(code, "SF"):
		return nil, "", code
	case code == "25006":
		return ErrReadOnly, "the server is a read-only replica or in recovery (point DB at the primary), or the transaction is READ ONLY (fence a read-write one)", ""
	case code == "42P01" || code == "42703":
		return ErrSchema, "the cluster tables are missing or altered; restart a node so New recreates them", ""
	case code == "42883":
		return ErrSchema, "a function of the cluster schema is missing; run clusterctl migrate, or restart a node with DDL rights so New upgrades the tables", ""
	case code == "42501":
		return nil, "permission denied: the role needs SELECT, INSERT and UPDATE on the cluster tables and EXECUTE on their functions (docs/guarantees.md, What an operator must configure)", ""
	case code == "42601":
		return nil, "syntax error: is Dialect right for this database?", ""
	case code == "26000":
		return nil, "a prepared statement went missing: behind a transaction pooler (PgBouncer before 1.21) add default_query_exec_mode=exec to the DSN (docs/operating.md, PgBouncer)", ""
	case code == "42P05":
		return nil, "a prepared statement of that name already exists on the server connection: behind a transaction pooler, sessions share server connections; add default_query_exec_mode=exec to the DSN, or run PgBouncer 1.21 or later with max_prepared_statements (docs/operating.md, PgBouncer)", ""
	case code == "55P03":
		return nil, "lock_timeout: a transaction held the cluster tables for too long", ""
	case code == "57014":
		return nil, "the statement was cancelled or hit its time limit", ""
	case strings.HasPrefix(code, "53"):
		return nil, "the server is out of resources (connections, memory or disk)", ""
	}
	return nil, "", ""
}

func (d *postgres) transient(error) bool { return false }

// endTx ends the transaction on conn, committing when ok.
func endTx(ctx context.Context, conn provider.Querier, ok bool) error {
	if !ok {
		_, err := conn.Exec(ctx, "ROLLBACK")
		return err
	}
	_, err := conn.Exec(ctx, "COMMIT")
	return err
}

func (d *postgres) seenByLease() bool { return true }

func (d *postgres) notifies() bool { return true }
