package cluster

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// SchemaVersion is the version of the cluster tables this package writes.
// [New] refuses a database whose tables carry a newer version, and runs no
// DDL at all when they carry this one.
const SchemaVersion = 3

// schemaLockTimeout bounds how long schema changes wait for the cluster
// tables while a transaction (a fenced one, say) holds them.
const schemaLockTimeout = 5 * time.Second

//go:embed schema/*.sql
var schemaFS embed.FS

// dbProvider is the default [Provider]: one row per lease in the
// <prefix>lease table of a PostgreSQL, SQLite or MySQL database.
type dbProvider struct {
	db      *sql.DB
	dialect Dialect
	prefix  string
	log     *slog.Logger
	q       map[string]string

	// Learnt by Init.
	mariadb bool // MySQL dialect served by MariaDB: SET STATEMENT bounds each statement
}

var (
	_ Provider    = (*dbProvider)(nil)
	_ Initializer = (*dbProvider)(nil)
)

// NewDBProvider returns the default [Provider] over db: one row per lease
// in the table <tablePrefix>lease, created by its Init method (which [New]
// calls). Use it to wrap the default provider, for example with metrics;
// [New] builds one itself when [Config.Provider] is nil. An empty dialect
// is detected from db's driver; an empty tablePrefix means "cluster_".
func NewDBProvider(db *sql.DB, dialect Dialect, tablePrefix string) (Provider, error) {
	cfg, err := Config{NodeID: "-", DB: db, Dialect: dialect, TablePrefix: tablePrefix}.resolve()
	if err != nil {
		return nil, err
	}
	return newDBProvider(cfg.DB, cfg.Dialect, cfg.TablePrefix, cfg.Logger), nil
}

func newDBProvider(db *sql.DB, d Dialect, prefix string, log *slog.Logger) *dbProvider {
	p := &dbProvider{db: db, dialect: d, prefix: prefix, log: log}
	p.q = parseQueries(p.load(string(d)+"_queries.sql", ""))
	return p
}

// load reads an embedded SQL file with the table prefix and schema
// substituted. The prefix was validated against prefixPattern, so it is a
// plain identifier; schema is quoted by quoteIdent.
func (p *dbProvider) load(name, schema string) string {
	b, err := schemaFS.ReadFile("schema/" + name)
	if err != nil {
		panic("cluster: missing embedded " + name) // a build defect, not input
	}
	return strings.NewReplacer("{{prefix}}", p.prefix, "{{schema}}", schema).Replace(string(b))
}

// quoteIdent quotes a PostgreSQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// splitStatements splits a schema file into statements: each ends at a line
// that starts in column 0 and ends with ";". Comment lines are dropped.
func splitStatements(src string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		cur.WriteString(line)
		if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") && strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	return out
}

// parseQueries reads "-- name: x" sections of a queries file.
func parseQueries(src string) map[string]string {
	q := map[string]string{}
	name := ""
	var cur strings.Builder
	flush := func() {
		if name != "" {
			q[name] = strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")
		}
		cur.Reset()
	}
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if n, ok := strings.CutPrefix(trimmed, "-- name:"); ok {
			flush()
			name = strings.TrimSpace(n)
			continue
		}
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return q
}

// Init checks the cluster tables and, only when they are missing or of an
// older schema version, creates or upgrades them under a lock that
// serializes nodes booting at once. It refuses a newer schema version.
// When the version is current it runs no DDL, so it works on a read-only
// replica and takes no lock that could queue behind an open transaction.
func (p *dbProvider) Init(ctx context.Context) error {
	conn, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	switch p.dialect {
	case SQLite:
		var ms int64
		if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms); err == nil && ms == 0 {
			p.log.WarnContext(ctx, "cluster: SQLite busy_timeout is 0, so nodes sharing the file fail instead of waiting for each other; "+
				"add _pragma=busy_timeout(5000) to the DSN")
		}
	case MySQL:
		if err := p.probeMySQL(ctx, conn); err != nil {
			return err
		}
	}
	have, err := p.schemaVersion(ctx, conn)
	if err != nil {
		return err
	}
	if have == SchemaVersion {
		return nil
	}
	unlock, err := p.lockSchema(ctx, conn)
	if err != nil {
		return p.wrap("lock schema", err)
	}
	err = p.applySchema(ctx, conn)
	if uerr := unlock(err); err == nil && uerr != nil {
		err = p.wrap("unlock schema", uerr)
	}
	return err
}

// schemaVersion reads the recorded schema version without taking a lock:
// 0 when the tables are missing, an error wrapping ErrSchema when it is
// newer than this build.
func (p *dbProvider) schemaVersion(ctx context.Context, q DBTX) (int64, error) {
	var have sql.NullInt64
	err := q.QueryRowContext(ctx, p.q["version_read"]).Scan(&have)
	if err != nil {
		if errors.Is(p.wrap("", err), ErrSchema) {
			return 0, nil // no tables yet
		}
		return 0, p.wrap("read schema version", err)
	}
	if have.Int64 > SchemaVersion {
		return 0, fmt.Errorf("%w: table %sschema_version records version %d, newer than the %d this build knows; upgrade github.com/sqlfence/cluster",
			ErrSchema, p.prefix, have.Int64, SchemaVersion)
	}
	return have.Int64, nil
}

// probeMySQL tells MariaDB from MySQL, and warns when this role may create
// temporary tables, which lets a session of it hide the lease table from
// the chain-tip guard (see schema/mysql.sql).
func (p *dbProvider) probeMySQL(ctx context.Context, conn *sql.Conn) error {
	var version string
	if err := conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return p.wrap("read server version", err)
	}
	p.mariadb = strings.Contains(strings.ToLower(version), "mariadb")
	probe := p.prefix + "temp_probe"
	if _, err := conn.ExecContext(ctx, "CREATE TEMPORARY TABLE "+probe+" (x INT)"); err == nil {
		conn.ExecContext(context.WithoutCancel(ctx), "DROP TEMPORARY TABLE IF EXISTS "+probe)
		p.log.WarnContext(ctx, "cluster: this MySQL role holds CREATE TEMPORARY TABLES: a session of it can hide the lease table behind a temporary one "+
			"and write chain tips under a made-up fencing token; revoke the privilege from the application's role (see the README, What the database enforces)",
			"server_version", version)
	}
	return nil
}

// lockSchema takes the cross-process schema lock on conn. The returned func
// ends it, committing when err is nil.
func (p *dbProvider) lockSchema(ctx context.Context, conn *sql.Conn) (func(err error) error, error) {
	background := context.WithoutCancel(ctx)
	switch p.dialect {
	case Postgres:
		// DDL is transactional; the advisory lock ends with the transaction.
		// lock_timeout keeps DDL from queueing behind an open transaction on
		// the cluster tables (and every lease read from queueing behind it).
		if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
			return nil, err
		}
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1)), set_config('lock_timeout', $2, true)",
			"sqlfence/cluster schema "+p.prefix, strconv.FormatInt(schemaLockTimeout.Milliseconds(), 10)); err != nil {
			conn.ExecContext(background, "ROLLBACK")
			return nil, err
		}
		return func(err error) error { return endTx(background, conn, err) }, nil
	case SQLite:
		// BEGIN IMMEDIATE takes the write lock now; DDL is transactional.
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			return nil, err
		}
		return func(err error) error { return endTx(background, conn, err) }, nil
	default:
		// MySQL DDL commits implicitly; a named lock serializes the nodes.
		name := "sqlfence_cluster_schema:" + p.prefix
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 60)", name).Scan(&got); err != nil {
			return nil, err
		}
		if got.Int64 != 1 {
			return nil, fmt.Errorf("GET_LOCK(%q) timed out after 60s: another node holds it while creating the schema", name)
		}
		// lock_wait_timeout bounds each DDL statement's wait for the tables'
		// metadata lock; the connection's own value is put back after.
		if _, err := conn.ExecContext(ctx, "SET @sqlfence_lock_wait_timeout = @@SESSION.lock_wait_timeout, SESSION lock_wait_timeout = ?",
			int64(schemaLockTimeout/time.Second)); err != nil {
			conn.ExecContext(background, "SELECT RELEASE_LOCK(?)", name)
			return nil, err
		}
		return func(error) error {
			_, err := conn.ExecContext(background, "SET SESSION lock_wait_timeout = @sqlfence_lock_wait_timeout")
			_, uerr := conn.ExecContext(background, "SELECT RELEASE_LOCK(?)", name)
			return errors.Join(err, uerr)
		}, nil
	}
}

func endTx(ctx context.Context, conn *sql.Conn, err error) error {
	if err != nil {
		_, rerr := conn.ExecContext(ctx, "ROLLBACK")
		return rerr
	}
	_, cerr := conn.ExecContext(ctx, "COMMIT")
	return cerr
}

// applySchema creates or upgrades the tables; the caller holds the schema
// lock. The schema file is idempotent and describes the whole current
// schema, so it serves a new database and every older version alike.
func (p *dbProvider) applySchema(ctx context.Context, conn *sql.Conn) error {
	schema := ""
	if p.dialect == Postgres {
		// Guard functions name their tables with the schema they live in,
		// so a temporary table cannot stand in for them.
		var cur sql.NullString
		if err := conn.QueryRowContext(ctx, "SELECT current_schema()").Scan(&cur); err != nil {
			return p.wrap("read current schema", err)
		}
		if !cur.Valid {
			return fmt.Errorf("%w: PostgreSQL has no current schema to create the cluster tables in: set search_path for the role or in the DSN", ErrSchema)
		}
		schema = quoteIdent(cur.String)
	}
	ddl := splitStatements(p.load(string(p.dialect)+".sql", schema))
	// The version table comes first so a newer schema is refused before we
	// touch anything else; another node may have upgraded while we waited
	// for the lock.
	if _, err := conn.ExecContext(ctx, ddl[0]); err != nil {
		return p.wrap("create schema_version table", err)
	}
	have, err := p.schemaVersion(ctx, conn)
	if err != nil || have == SchemaVersion {
		return err
	}
	for _, stmt := range ddl[1:] {
		if _, err := conn.ExecContext(ctx, stmt); err != nil && !p.triggerExists(err) {
			return p.wrap(fmt.Sprintf("upgrade the cluster tables from schema version %d to %d", have, SchemaVersion), err)
		}
	}
	if _, err := conn.ExecContext(ctx, p.q["version_write"], SchemaVersion); err != nil {
		return p.wrap("record schema version", err)
	}
	if have > 0 {
		p.log.InfoContext(ctx, "cluster: upgraded the cluster tables", "from_version", have, "to_version", SchemaVersion)
	}
	return nil
}

// isBusy reports SQLite's SQLITE_BUSY and SQLITE_LOCKED.
func (p *dbProvider) isBusy(err error) bool {
	var lite interface{ Code() int }
	if p.dialect != SQLite || !errors.As(err, &lite) {
		return false
	}
	code := lite.Code() & 0xff
	return code == 5 || code == 6
}

// triggerExists reports MySQL's error for CREATE TRIGGER of an existing
// trigger, which schema creation keeps rather than drop: MySQL DDL is not
// transactional, so a drop would leave a moment without the guard.
func (p *dbProvider) triggerExists(err error) bool {
	var my *mysql.MySQLError
	return p.dialect == MySQL && errors.As(err, &my) && my.Number == 1359
}

// conn takes a connection from the pool, telling an exhausted pool apart
// from a slow query.
func (p *dbProvider) conn(ctx context.Context) (*sql.Conn, error) {
	conn, err := p.db.Conn(ctx)
	// Opening a SQLite connection runs the DSN's pragmas; one that changes
	// the journal mode fails with SQLITE_BUSY, without waiting for the busy
	// timeout, while another node opens the same file. It is transient.
	for delay := 5 * time.Millisecond; err != nil && p.isBusy(err); delay = min(2*delay, 100*time.Millisecond) {
		select {
		case <-ctx.Done():
			return nil, p.wrap("connect", err)
		case <-time.After(delay):
		}
		conn, err = p.db.Conn(ctx)
	}
	if err == nil {
		return conn, nil
	}
	if isContextErr(err) {
		if s := p.db.Stats(); s.MaxOpenConnections > 0 && s.InUse >= s.MaxOpenConnections {
			return nil, fmt.Errorf("%w: all %d connections of the *sql.DB are in use (SetMaxOpenConns); raise the limit or shorten what holds them: %w",
				ErrPoolExhausted, s.MaxOpenConnections, err)
		}
	}
	return nil, p.wrap("connect", err)
}

// row is the lease row as the queries return it.
type row struct {
	holder, instance, endpoint string
	token, expiresAt, now      int64
}

func (r row) lease(name string) Lease {
	return Lease{Name: name, Holder: r.holder, Instance: r.instance, Endpoint: r.endpoint,
		FencingToken: uint64(r.token), ExpiresAt: time.UnixMilli(r.expiresAt)}
}

func (r row) held() *LeaseHeldError {
	return &LeaseHeldError{Holder: r.holder, Instance: r.instance, Endpoint: r.endpoint, FencingToken: uint64(r.token),
		ExpiresAt: time.UnixMilli(r.expiresAt), Remaining: time.Duration(r.expiresAt-r.now) * time.Millisecond}
}

// Acquire implements [Provider].
func (p *dbProvider) Acquire(ctx context.Context, req LeaseRequest) (Lease, error) {
	conn, err := p.conn(ctx)
	if err != nil {
		return Lease{}, err
	}
	defer conn.Close()
	ttl := req.TTL.Milliseconds()
	var r row
	var granted bool
	switch p.dialect {
	case MySQL:
		granted, r, err = p.acquireMySQL(ctx, conn, req)
	default:
		err = conn.QueryRowContext(ctx, p.q["acquire"], req.Name, req.Holder, req.Instance, ttl, req.Endpoint).
			Scan(&granted, &r.holder, &r.instance, &r.token, &r.expiresAt, &r.endpoint, &r.now)
		if errors.Is(err, sql.ErrNoRows) {
			// Not granted (SQLite), or the row was created concurrently after
			// our snapshot (PostgreSQL): read who holds it now.
			granted = false
			err = p.readRow(ctx, conn, req.Name, &r)
		}
	}
	if err != nil {
		return Lease{}, p.wrap("acquire lease "+quote(req.Name), err)
	}
	if !granted {
		return Lease{}, r.held()
	}
	return r.lease(req.Name), nil
}

func (p *dbProvider) readRow(ctx context.Context, conn *sql.Conn, name string, r *row) error {
	return conn.QueryRowContext(ctx, p.q["leader"], name).
		Scan(&r.holder, &r.instance, &r.token, &r.expiresAt, &r.endpoint, &r.now)
}

// acquireMySQL grants a term with one UPDATE, then reads the row: for the
// expiry of the term granted, or for who holds the lease.
func (p *dbProvider) acquireMySQL(ctx context.Context, conn *sql.Conn, req LeaseRequest) (bool, row, error) {
	var r row
	for attempt := 0; ; attempt++ {
		res, err := conn.ExecContext(ctx, p.bounded(ctx, p.q["acquire"]), req.Holder, req.Instance, req.TTL.Milliseconds(), req.Endpoint, req.Name)
		if err != nil {
			return false, r, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return false, r, err
		}
		var token int64
		if n == 1 {
			if err := conn.QueryRowContext(ctx, p.q["last_insert_id"]).Scan(&token); err != nil {
				return false, r, err
			}
		}
		err = p.readRow(ctx, conn, req.Name, &r)
		if errors.Is(err, sql.ErrNoRows) && attempt == 0 {
			// No row yet: create a free one and try again.
			if _, err := conn.ExecContext(ctx, p.bounded(ctx, p.q["insert_row"]), req.Name); err != nil {
				return false, r, err
			}
			continue
		}
		if err != nil {
			return false, r, err
		}
		// The row still shows our term unless it already expired and was
		// taken, in which case we report who took it.
		granted := n == 1 && r.instance == req.Instance && r.token == token
		return granted, r, nil
	}
}

// bounded gives a MySQL statement a server-side time limit a little
// shorter than what ctx leaves of the attempt. The driver abandons a
// cancelled statement by closing its connection, but the server would
// keep it waiting for the lease row's lock (innodb_lock_wait_timeout,
// 50s by default), so cancelled attempts would pile up behind an open
// fenced transaction. MariaDB bounds the whole statement (SET STATEMENT
// max_statement_time); MySQL 8 takes the lock-wait bound as an optimizer
// hint, in whole seconds. Other dialects need no bound: pgx cancels the
// statement on the server, and SQLite's busy_timeout bounds its waits.
func (p *dbProvider) bounded(ctx context.Context, q string) string {
	if p.dialect != MySQL {
		return q
	}
	limit := defaultStatementLimit
	if dl, ok := ctx.Deadline(); ok {
		limit = time.Until(dl) * 9 / 10
	}
	return mysqlBounded(q, limit, p.mariadb)
}

// defaultStatementLimit bounds a MySQL lease statement whose context has
// no deadline.
const defaultStatementLimit = 10 * time.Second

// mysqlBounded prefixes q with a server-side limit. The numbers are
// formatted here from a duration, never taken from input.
func mysqlBounded(q string, limit time.Duration, mariadb bool) string {
	limit = max(limit.Round(time.Millisecond), time.Millisecond)
	lockWait := max(int64((limit+time.Second-1)/time.Second), 1)
	if mariadb {
		return fmt.Sprintf("SET STATEMENT max_statement_time=%.3f, innodb_lock_wait_timeout=%d FOR %s", limit.Seconds(), lockWait, q)
	}
	verb, rest, _ := strings.Cut(q, " ")
	return fmt.Sprintf("%s /*+ SET_VAR(innodb_lock_wait_timeout=%d) MAX_EXECUTION_TIME(%d) */ %s", verb, lockWait, limit.Milliseconds(), rest)
}

// Renew implements [Provider].
func (p *dbProvider) Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	conn, err := p.conn(ctx)
	if err != nil {
		return l, err
	}
	defer conn.Close()
	var expires int64
	switch p.dialect {
	case MySQL:
		expires, err = p.renewMySQL(ctx, conn, l, ttl)
	default:
		err = conn.QueryRowContext(ctx, p.q["renew"], l.Name, l.Holder, l.Instance, int64(l.FencingToken), ttl.Milliseconds()).Scan(&expires)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return l, fmt.Errorf("%w: lease %q is no longer held by node %q with fencing token %d", ErrLeaseLost, l.Name, l.Holder, l.FencingToken)
	}
	if err != nil {
		return l, p.wrap("renew lease "+quote(l.Name), err)
	}
	l.ExpiresAt = time.UnixMilli(expires)
	return l, nil
}

// renewMySQL extends the term with one UPDATE, then reads the new expiry
// that the UPDATE left in LAST_INSERT_ID.
func (p *dbProvider) renewMySQL(ctx context.Context, conn *sql.Conn, l Lease, ttl time.Duration) (int64, error) {
	res, err := conn.ExecContext(ctx, p.bounded(ctx, p.q["renew"]), ttl.Milliseconds(), l.Name, l.Holder, l.Instance, int64(l.FencingToken))
	if err != nil {
		return 0, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, err
	} else if n != 1 {
		return 0, sql.ErrNoRows
	}
	var expires int64
	err = conn.QueryRowContext(ctx, p.q["last_insert_id"]).Scan(&expires)
	return expires, err
}

// Release implements [Provider].
func (p *dbProvider) Release(ctx context.Context, l Lease) error {
	conn, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	token := int64(l.FencingToken)
	args := []any{l.Name, l.Holder, l.Instance, token}
	if p.dialect == MySQL {
		args = append(args, token)
	}
	if _, err := conn.ExecContext(ctx, p.bounded(ctx, p.q["release"]), args...); err != nil {
		return p.wrap("release lease "+quote(l.Name), err)
	}
	return nil
}

// Leader implements [Provider].
func (p *dbProvider) Leader(ctx context.Context, name string) (*Leader, error) {
	conn, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var r row
	err = p.readRow(ctx, conn, name, &r)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, p.wrap("read lease "+quote(name), err)
	}
	if r.expiresAt <= r.now || r.token == 0 {
		return nil, nil
	}
	return &Leader{NodeID: r.holder, Endpoint: r.endpoint, FencingToken: uint64(r.token), LeaseExpiresAt: time.UnixMilli(r.expiresAt)}, nil
}

func quote(s string) string { return fmt.Sprintf("%q", s) }

// guardErrors maps the SQLSTATEs our guard triggers raise (SIGNAL on
// MySQL, a "sqlfence SFnnn:" message prefix on SQLite) to sentinels.
var guardErrors = map[string]struct {
	kind error
	hint string
}{
	"SF001": {ErrStaleFencingToken, "the database refused a write under a fencing token that is not the current lease's"},
	"SF002": {ErrTipBackwards, "the database refused to move a chain tip backwards"},
	"SF003": {ErrTipDeleted, "the database refused to delete, truncate or rename a chain tip"},
	"SF004": {ErrLeaseDeleted, "the database refused to delete, truncate or rename a lease row"},
	"SF005": {ErrTipRewritten, "the database refused to record another hash at a chain tip's counter"},
	"SF006": {ErrTokenLowered, "the database refused to lower a fencing token or a high-water mark"},
	"SF007": {ErrRollbackDetected, "the lease row is below the highest fencing token the database ever granted: it was truncated or restored on its own; " +
		"an operator must restore the token (see the README) before any node may lead"},
}

var sqliteGuard = regexp.MustCompile(`sqlfence (SF\d{3}):`)

// wrap turns a driver error into one that says what went wrong, wrapping
// one of our sentinels where one applies. It is the one place that reads
// driver error codes.
func (p *dbProvider) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var kind error
	hint := ""
	guard := ""
	switch p.dialect {
	case Postgres:
		var pg interface{ SQLState() string }
		if errors.As(err, &pg) {
			switch code := pg.SQLState(); {
			case strings.HasPrefix(code, "SF"):
				guard = code
			case code == "25006":
				kind = ErrReadOnly
				hint = "the server is a read-only replica or in recovery; point DB at the primary"
			case code == "42P01" || code == "42703":
				kind = ErrSchema
				hint = "the cluster tables are missing or altered; restart a node so New recreates them"
			case code == "42601":
				hint = "syntax error: is Dialect right for this database?"
			case code == "55P03":
				hint = "lock_timeout: a transaction held the cluster tables for too long"
			case code == "57014":
				hint = "the statement was cancelled or hit its time limit"
			case strings.HasPrefix(code, "53"):
				hint = "the server is out of resources (connections, memory or disk)"
			}
		}
	case MySQL:
		var my *mysql.MySQLError
		if errors.As(err, &my) {
			if code := string(my.SQLState[:]); strings.HasPrefix(code, "SF") {
				guard = code
			}
			switch my.Number {
			case 1290, 1792, 1836:
				kind = ErrReadOnly
				hint = "the server or session is read-only (read_only, or a READ ONLY transaction); point DB at the primary"
			case 1146, 1054:
				kind = ErrSchema
				hint = "the cluster tables are missing or altered; restart a node so New recreates them"
			case 1064:
				hint = "syntax error: is Dialect right for this database?"
			case 1205, 1213:
				hint = "lock wait timeout or deadlock on the lease row; it is retried"
			case 1969, 3024:
				hint = "the statement reached its time limit (a transaction holds the lease row)"
			}
		}
	case SQLite:
		var lite interface{ Code() int }
		if errors.As(err, &lite) {
			switch lite.Code() & 0xff {
			case 8: // SQLITE_READONLY
				kind = ErrReadOnly
				hint = "the database file or its directory is not writable"
			case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
				hint = "another connection holds the write lock; set a busy timeout (_pragma=busy_timeout(5000) in the DSN)"
			}
		}
		msg := err.Error()
		if m := sqliteGuard.FindStringSubmatch(msg); m != nil {
			guard = m[1]
		}
		if kind == nil && guard == "" && strings.Contains(msg, "no such table") {
			kind = ErrSchema
			hint = "the cluster tables are missing; restart a node so New recreates them"
		}
		if kind == nil && strings.Contains(msg, "syntax error") {
			hint = "syntax error: is Dialect right for this database?"
		}
	}
	if g, ok := guardErrors[guard]; ok {
		kind, hint = g.kind, g.hint
	}
	if hint != "" {
		op += " (" + hint + ")"
	}
	if kind != nil {
		return fmt.Errorf("%w: %s: %w", kind, op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}
