package cluster

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// SchemaVersion is the version of the cluster tables this package writes.
// [New] refuses a database whose tables carry a newer version.
const SchemaVersion = 2

//go:embed schema/*.sql
var schemaFS embed.FS

// dbProvider is the default [Provider]: one row per lease in the
// <prefix>lease table of a PostgreSQL, SQLite or MySQL database.
type dbProvider struct {
	db      *sql.DB
	dialect Dialect
	prefix  string
	log     *slog.Logger
	ddl     []string
	q       map[string]string
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
	p.ddl = splitStatements(p.load(string(d) + ".sql"))
	p.q = parseQueries(p.load(string(d) + "_queries.sql"))
	return p
}

// load reads an embedded SQL file with the table prefix substituted. The
// prefix was validated against prefixPattern, so it is a plain identifier.
func (p *dbProvider) load(name string) string {
	b, err := schemaFS.ReadFile("schema/" + name)
	if err != nil {
		panic("cluster: missing embedded " + name) // a build defect, not input
	}
	return strings.ReplaceAll(string(b), "{{prefix}}", p.prefix)
}

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

// Init creates the cluster tables if they are missing, under a lock that
// serializes nodes booting at once, and refuses a newer schema version.
func (p *dbProvider) Init(ctx context.Context) error {
	conn, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if p.dialect == SQLite {
		var ms int64
		if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms); err == nil && ms == 0 {
			p.log.WarnContext(ctx, "cluster: SQLite busy_timeout is 0, so nodes sharing the file fail instead of waiting for each other; "+
				"add _pragma=busy_timeout(5000) to the DSN")
		}
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

// lockSchema takes the cross-process schema lock on conn. The returned func
// ends it, committing when err is nil.
func (p *dbProvider) lockSchema(ctx context.Context, conn *sql.Conn) (func(err error) error, error) {
	background := context.WithoutCancel(ctx)
	switch p.dialect {
	case Postgres:
		// DDL is transactional; the advisory lock ends with the transaction.
		if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
			return nil, err
		}
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "sqlfence/cluster schema "+p.prefix); err != nil {
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
		return func(error) error {
			_, err := conn.ExecContext(background, "SELECT RELEASE_LOCK(?)", name)
			return err
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

func (p *dbProvider) applySchema(ctx context.Context, conn *sql.Conn) error {
	// The version table comes first so a newer schema is refused before we
	// touch anything else.
	if _, err := conn.ExecContext(ctx, p.ddl[0]); err != nil {
		return p.wrap("create schema_version table", err)
	}
	var have sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT MAX(version) FROM "+p.prefix+"schema_version").Scan(&have); err != nil {
		return p.wrap("read schema version", err)
	}
	if have.Int64 > SchemaVersion {
		return fmt.Errorf("%w: table %sschema_version records version %d, newer than the %d this build knows; upgrade github.com/sqlfence/cluster",
			ErrSchema, p.prefix, have.Int64, SchemaVersion)
	}
	for _, stmt := range p.ddl[1:] {
		if _, err := conn.ExecContext(ctx, stmt); err != nil && !p.triggerExists(err) {
			return p.wrap("create tables", err)
		}
	}
	if have.Int64 < SchemaVersion {
		if _, err := conn.ExecContext(ctx, p.bind("INSERT INTO "+p.prefix+"schema_version (version, applied_at) VALUES (?, ?)"),
			SchemaVersion, time.Now().UnixMilli()); err != nil {
			return p.wrap("record schema version", err)
		}
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

// bind rewrites ? placeholders for PostgreSQL.
func (p *dbProvider) bind(q string) string {
	if p.dialect != Postgres {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
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
	return &LeaseHeldError{Holder: r.holder, Instance: r.instance, FencingToken: uint64(r.token),
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
		res, err := conn.ExecContext(ctx, p.q["acquire"], req.Holder, req.Instance, req.TTL.Milliseconds(), req.Endpoint, req.Name)
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
			if _, err := conn.ExecContext(ctx, p.q["insert_row"], req.Name); err != nil {
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
	res, err := conn.ExecContext(ctx, p.q["renew"], ttl.Milliseconds(), l.Name, l.Holder, l.Instance, int64(l.FencingToken))
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
	if _, err := conn.ExecContext(ctx, p.q["release"], args...); err != nil {
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

// wrap turns a driver error into one that says what went wrong, wrapping
// one of our sentinels where one applies. It is the one place that reads
// driver error codes.
func (p *dbProvider) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var kind error
	hint := ""
	switch p.dialect {
	case Postgres:
		var pg interface{ SQLState() string }
		if errors.As(err, &pg) {
			switch code := pg.SQLState(); {
			case code == "SF001":
				kind = ErrStaleFencingToken
				hint = "the database refused a write under a fencing token that is not the current lease's"
			case code == "SF002":
				kind = ErrTipBackwards
				hint = "the database refused to move a chain tip backwards"
			case code == "25006":
				kind = ErrReadOnly
				hint = "the server is a read-only replica or in recovery; point DB at the primary"
			case code == "42P01" || code == "42703":
				kind = ErrSchema
				hint = "the cluster tables are missing or altered; restart a node so New recreates them"
			case code == "42601":
				hint = "syntax error: is Dialect right for this database?"
			case strings.HasPrefix(code, "53"):
				hint = "the server is out of resources (connections, memory or disk)"
			}
		}
	case MySQL:
		var my *mysql.MySQLError
		if errors.As(err, &my) {
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
			case 1644: // SIGNAL from a guard trigger
				switch {
				case strings.Contains(my.Message, "stale fencing token"):
					kind = ErrStaleFencingToken
					hint = "the database refused a write under a fencing token that is not the current lease's"
				case strings.Contains(my.Message, "moving backwards"):
					kind = ErrTipBackwards
					hint = "the database refused to move a chain tip backwards"
				}
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
		switch msg := err.Error(); {
		case strings.Contains(msg, "sqlfence: stale fencing token"):
			kind = ErrStaleFencingToken
			hint = "the database refused a write under a fencing token that is not the current lease's"
		case strings.Contains(msg, "sqlfence: chain tip moving backwards"):
			kind = ErrTipBackwards
			hint = "the database refused to move a chain tip backwards"
		}
		if kind == nil && strings.Contains(err.Error(), "no such table") {
			kind = ErrSchema
			hint = "the cluster tables are missing; restart a node so New recreates them"
		}
		if kind == nil && strings.Contains(err.Error(), "syntax error") {
			hint = "syntax error: is Dialect right for this database?"
		}
	}
	if hint != "" {
		op += " (" + hint + ")"
	}
	if kind != nil {
		return fmt.Errorf("%w: %s: %w", kind, op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}
