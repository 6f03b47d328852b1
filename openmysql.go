package cluster

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlfence/cluster/internal/fencedbegin"
)

// OpenMySQL opens a database/sql pool of go-sql-driver/mysql on cfg, as
// sql.OpenDB(mysql.NewConnector(cfg)) would, whose connections can begin
// a fenced transaction without a round trip of its own:
// [Cluster.BeginFenced] on it sends no START TRANSACTION when the
// connection's previous transaction was fenced too, and the fence's
// locked read opens the transaction, so back-to-back fenced transactions
// take no more round trips than the same ones begun with db.BeginTx (as
// BeginFenced does on a PostgreSQL pool of clusterpgx.OpenDB by sending
// the BEGIN and the fence together).
//
// It does so by running a session with autocommit off from a fenced
// transaction until the next statement or plain transaction, before which
// the pool turns autocommit back on: one round trip each time a
// connection switches from fenced transactions to other work (the first
// fenced transaction after other work sends SET autocommit = 0 where
// BeginTx would send START TRANSACTION). Give the cluster this pool as
// [Config.DB] (its fence's read is then prepared, and its heartbeats
// switch a connection at most once per heartbeat) and run the fenced
// transactions on it; keep reads and other statements on another pool,
// or they pay that round trip after each fenced transaction on their
// connection. Everything else behaves as on mysql.NewConnector's pool:
// statements outside transactions autocommit, transactions begun with
// BeginTx run with autocommit on, and the Driver is mysql's.
//
// Every session starts with autocommit on, whatever the server's global
// setting or init_connect: the pool adds autocommit=1 to cfg's Params,
// and refuses a cfg whose Params set autocommit. Do not change autocommit
// on the pool's sessions yourself (SET autocommit): the pool tracks it,
// and a fenced transaction begun on a session it believes has autocommit
// off would release the fence's lock as soon as the read ends. Behind a
// proxy that routes statements (ProxySQL's read/write split), which sees
// no START TRANSACTION to pin the transaction to the primary by, open the
// pool with sql.Open and fence with BeginTx and [Cluster.Fence].
//
// A statement that ends the transaction early (DDL, LOCK TABLES, or a
// deadlock, which rolls it back) ends the fence with it, on any pool:
// roll back and retry. Here the statements after it would be held until
// Commit, where on another pool they would autocommit one by one;
// unfenced either way.
func OpenMySQL(cfg *mysql.Config) (*sql.DB, error) {
	c, err := newMySQLConnector(cfg, "cluster.OpenMySQL")
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

// NewMySQLConnector returns the connector [OpenMySQL] opens its pool on,
// for code that wraps a connector before sql.OpenDB (connection-wrapping
// instrumentation such as otelsql or sqlcommenter): the pool of
// sql.OpenDB(wrap(connector)) begins fenced transactions as OpenMySQL's
// does, provided the wrapper hands each call on to the connection with
// its context, as they do. It refuses what OpenMySQL refuses. The
// wrapper's Driver may not be mysql's: give [Config.Dialect] then.
func NewMySQLConnector(cfg *mysql.Config) (driver.Connector, error) {
	return newMySQLConnector(cfg, "cluster.NewMySQLConnector")
}

func newMySQLConnector(cfg *mysql.Config, call string) (driver.Connector, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: %s needs a *mysql.Config (mysql.ParseDSN or mysql.NewConfig); it was given nil", ErrInvalidConfig, call)
	}
	for name, val := range cfg.Params {
		if isAutocommit(name) {
			return nil, fmt.Errorf("%w: %s manages its sessions' autocommit; remove %s=%s from the DSN (or open the pool with sql.Open and fence with BeginTx and Fence)",
				ErrInvalidConfig, call, name, val)
		}
	}
	cfg = cfg.Clone()
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["autocommit"] = "1" // sent with the DSN's other settings, in one SET
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, call, err)
	}
	return mysqlConnector{c}, nil
}

// isAutocommit reports whether a DSN parameter (a system variable the
// driver SETs on connecting) names autocommit: autocommit,
// @@autocommit, @@session.autocommit, session autocommit and the like.
func isAutocommit(param string) bool {
	p := strings.ToLower(strings.TrimSpace(param))
	p = strings.TrimPrefix(p, "@@")
	for _, scope := range []string{"session.", "local.", "session ", "local "} {
		p = strings.TrimSpace(strings.TrimPrefix(p, scope))
	}
	return strings.Trim(p, "`") == "autocommit"
}

// mysqlConnector is go-sql-driver/mysql's connector whose connections are
// mysqlFencingConns; Driver is mysql's, so dialect detection sees MySQL.
type mysqlConnector struct{ driver.Connector }

func (mc mysqlConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := mc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	c, ok := dc.(mysqlDriverConn)
	if !ok {
		return dc, nil // another version's connection: begin as it does
	}
	return &mysqlFencingConn{c: c}, nil
}

// mysqlDriverConn is everything database/sql uses of go-sql-driver/mysql's
// connection.
type mysqlDriverConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
	driver.NamedValueChecker
}

// mysqlDriverStmt is everything database/sql uses of its statements.
type mysqlDriverStmt interface {
	driver.Stmt
	driver.StmtExecContext
	driver.StmtQueryContext
	driver.NamedValueChecker
}

// A mysqlFencingConn is a connection of go-sql-driver/mysql that can begin
// a transaction with autocommit off instead of START TRANSACTION.
// database/sql uses a connection from one goroutine at a time, so its
// fields need no lock.
type mysqlFencingConn struct {
	c mysqlDriverConn
	// autocommitOff: the session runs with autocommit off (set by an
	// implicit begin, cleared before a statement outside a transaction
	// and before a plain transaction).
	autocommitOff bool
	// inTx: a transaction begun on the connection has not ended yet.
	inTx bool
	// broken: a statement of the pool's own (SET autocommit, SET
	// TRANSACTION, the implicit COMMIT or ROLLBACK) failed, so the
	// session's state is not known: database/sql discards the connection.
	broken bool
	// lastErr is the error of the statement after which the driver closed
	// the connection, for the implicit Commit and Rollback to report.
	lastErr error
}

var _ mysqlDriverConn = (*mysqlFencingConn)(nil)

// BeginTx begins a transaction as go-sql-driver/mysql does, with
// autocommit on, or, asked by BeginFenced (a transaction that is not
// read-only), with nothing sent when the session's autocommit is off
// already, else after turning it off: the next statement, the fence's
// read, opens the transaction.
func (fc *mysqlFencingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if fencedbegin.From(ctx) == nil || opts.ReadOnly {
		if err := fc.autocommit(ctx); err != nil {
			return nil, err
		}
		tx, err := fc.c.BeginTx(ctx, opts)
		if err != nil {
			fc.record(err)
			return nil, err
		}
		fc.inTx = true
		return &mysqlTx{fc: fc, tx: tx}, nil
	}
	if !fc.IsValid() {
		return nil, driver.ErrBadConn
	}
	var level string
	if l := sql.IsolationLevel(opts.Isolation); l != sql.LevelDefault {
		var err error
		if level, err = mysqlIsolation(l); err != nil {
			return nil, err
		}
	}
	if !fc.autocommitOff {
		if err := fc.own(ctx, "SET autocommit = 0"); err != nil {
			return nil, err
		}
		fc.autocommitOff = true
	}
	if level != "" {
		// Applies to the next transaction, begun explicitly or not.
		if err := fc.own(ctx, "SET TRANSACTION ISOLATION LEVEL "+level); err != nil {
			return nil, err
		}
	}
	fc.inTx = true
	return &mysqlTx{fc: fc}, nil
}

// own runs one of the pool's own statements, before any of the caller's:
// on failure the session's state is not known, so the connection is
// marked broken and, unless ctx ended, database/sql is told to retry on
// another (driver.ErrBadConn: nothing of the caller's was sent).
func (fc *mysqlFencingConn) own(ctx context.Context, stmt string) error {
	if _, err := fc.c.ExecContext(ctx, stmt, nil); err != nil {
		fc.broken = true
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return driver.ErrBadConn
	}
	return nil
}

// mysqlIsolation is the SQL of an isolation level, as go-sql-driver/mysql
// spells it.
func mysqlIsolation(l sql.IsolationLevel) (string, error) {
	switch l {
	case sql.LevelReadUncommitted:
		return "READ UNCOMMITTED", nil
	case sql.LevelReadCommitted:
		return "READ COMMITTED", nil
	case sql.LevelRepeatableRead:
		return "REPEATABLE READ", nil
	case sql.LevelSerializable:
		return "SERIALIZABLE", nil
	}
	return "", fmt.Errorf("%w: cluster.BeginFenced: unsupported isolation level %v: MySQL has READ UNCOMMITTED, READ COMMITTED, REPEATABLE READ and SERIALIZABLE", ErrInvalidConfig, l)
}

// autocommit turns the session's autocommit back on before a statement
// outside a transaction, which would otherwise open one that nothing
// commits, and before a plain transaction.
func (fc *mysqlFencingConn) autocommit(ctx context.Context) error {
	if !fc.autocommitOff || fc.inTx {
		return nil
	}
	if err := fc.own(ctx, "SET autocommit = 1"); err != nil {
		return err
	}
	fc.autocommitOff = false
	return nil
}

// record keeps err when the driver closed the connection after it.
func (fc *mysqlFencingConn) record(err error) {
	if err != nil && !fc.c.IsValid() && fc.lastErr == nil {
		fc.lastErr = err
	}
}

func (fc *mysqlFencingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := fc.autocommit(ctx); err != nil {
		return nil, err
	}
	res, err := fc.c.ExecContext(ctx, query, args)
	fc.record(err)
	return res, err
}

func (fc *mysqlFencingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := fc.autocommit(ctx); err != nil {
		return nil, err
	}
	rows, err := fc.c.QueryContext(ctx, query, args)
	fc.record(err)
	return rows, err
}

func (fc *mysqlFencingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := fc.c.PrepareContext(ctx, query)
	if err != nil {
		fc.record(err)
		return nil, err
	}
	ms, ok := s.(mysqlDriverStmt)
	if !ok {
		s.Close()
		return nil, fmt.Errorf("cluster.OpenMySQL: go-sql-driver/mysql prepared a %T, which lacks what database/sql needs", s)
	}
	return &mysqlStmt{s: ms, fc: fc}, nil
}

func (fc *mysqlFencingConn) Prepare(query string) (driver.Stmt, error) {
	return fc.PrepareContext(context.Background(), query)
}

func (fc *mysqlFencingConn) Begin() (driver.Tx, error) {
	return fc.BeginTx(context.Background(), driver.TxOptions{})
}

// IsValid reports false once the session's state is not known, so that
// database/sql closes the connection rather than reuse it.
func (fc *mysqlFencingConn) IsValid() bool { return !fc.broken && fc.c.IsValid() }

func (fc *mysqlFencingConn) ResetSession(ctx context.Context) error {
	if fc.broken {
		return driver.ErrBadConn
	}
	return fc.c.ResetSession(ctx)
}

func (fc *mysqlFencingConn) Close() error                   { return fc.c.Close() }
func (fc *mysqlFencingConn) Ping(ctx context.Context) error { return fc.c.Ping(ctx) }
func (fc *mysqlFencingConn) CheckNamedValue(nv *driver.NamedValue) error {
	return fc.c.CheckNamedValue(nv)
}

// A mysqlTx is a transaction of a mysqlFencingConn: go-sql-driver/mysql's
// (tx set) or one begun implicitly, ended with COMMIT or ROLLBACK.
type mysqlTx struct {
	fc *mysqlFencingConn
	tx driver.Tx
}

func (t *mysqlTx) Commit() error   { return t.end("COMMIT") }
func (t *mysqlTx) Rollback() error { return t.end("ROLLBACK") }

func (t *mysqlTx) end(stmt string) error {
	if t.fc == nil {
		return mysql.ErrInvalidConn // ended already, as the driver reports it
	}
	fc := t.fc
	t.fc = nil
	fc.inTx = false
	switch {
	case t.tx != nil && stmt == "COMMIT":
		return t.tx.Commit()
	case t.tx != nil:
		return t.tx.Rollback()
	}
	if _, err := fc.c.ExecContext(context.Background(), stmt, nil); err != nil {
		fc.broken = true // whether the transaction ended is not known
		if fc.lastErr != nil && !fc.c.IsValid() {
			// The driver closed the connection after a statement of the
			// transaction failed (a cancelled context, a lost
			// connection): report why, as its own transactions do.
			return fc.lastErr
		}
		return err
	}
	return nil
}

// A mysqlStmt is a prepared statement of a mysqlFencingConn, which turns
// autocommit back on before it runs outside a transaction.
type mysqlStmt struct {
	s  mysqlDriverStmt
	fc *mysqlFencingConn
}

func (s *mysqlStmt) Close() error  { return s.s.Close() }
func (s *mysqlStmt) NumInput() int { return s.s.NumInput() }

func (s *mysqlStmt) CheckNamedValue(nv *driver.NamedValue) error { return s.s.CheckNamedValue(nv) }

func (s *mysqlStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if err := s.fc.autocommit(ctx); err != nil {
		return nil, err
	}
	res, err := s.s.ExecContext(ctx, args)
	s.fc.record(err)
	return res, err
}

func (s *mysqlStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := s.fc.autocommit(ctx); err != nil {
		return nil, err
	}
	rows, err := s.s.QueryContext(ctx, args)
	s.fc.record(err)
	return rows, err
}

//lint:ignore SA1019 driver.Stmt requires them; database/sql calls the Context forms.
func (s *mysqlStmt) Exec(args []driver.Value) (driver.Result, error) {
	if err := s.fc.autocommit(context.Background()); err != nil {
		return nil, err
	}
	return s.s.Exec(args)
}

func (s *mysqlStmt) Query(args []driver.Value) (driver.Rows, error) {
	if err := s.fc.autocommit(context.Background()); err != nil {
		return nil, err
	}
	return s.s.Query(args)
}
