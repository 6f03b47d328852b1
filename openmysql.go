package cluster

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// OpenMySQL opens a database/sql pool of go-sql-driver/mysql on cfg, as
// sql.OpenDB(mysql.NewConnector(cfg)) would, whose connections can begin
// a fenced transaction without a round trip of its own: [BeginFenced] and
// [Cluster.BeginFenced] on it send no START TRANSACTION, and the fence's
// locked read opens the transaction, so the fenced transaction takes no
// more round trips than the same one begun with db.BeginTx (as
// clusterpgx.BeginFencedSQL does on PostgreSQL by sending the BEGIN and
// the fence together).
//
// It does so by running the session with autocommit off from the first
// fenced transaction on, and the pool keeps that invisible: a statement
// outside a transaction on such a session first turns autocommit back on
// (one round trip, once), and transactions begun with BeginTx behave as
// on any pool. Do not change autocommit on the pool's sessions yourself
// (SET autocommit): the pool tracks it, and a fenced transaction begun on
// a session it believes has autocommit off would release the fence's
// lock as soon as the read ends. Everything else behaves as on
// mysql.NewConnector's pool, the Driver included, so the pool can be
// [Config.DB] too.
func OpenMySQL(cfg *mysql.Config) (*sql.DB, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: cluster.OpenMySQL needs a *mysql.Config (mysql.ParseDSN or mysql.NewConfig); it was given nil", ErrInvalidConfig)
	}
	for name := range cfg.Params {
		if strings.EqualFold(name, "autocommit") {
			return nil, fmt.Errorf("%w: cluster.OpenMySQL manages its sessions' autocommit; remove %s=%s from the DSN (or open the pool with sql.Open and fence with BeginTx and Fence)",
				ErrInvalidConfig, name, cfg.Params[name])
		}
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: cluster.OpenMySQL: %w", ErrInvalidConfig, err)
	}
	return sql.OpenDB(mysqlConnector{c}), nil
}

// implicitBeginKey is the context key under which BeginFenced asks a
// connection of an OpenMySQL pool to begin its transaction implicitly.
type implicitBeginKey struct{}

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
// two flags need no lock.
type mysqlFencingConn struct {
	c mysqlDriverConn
	// autocommitOff: the session runs with autocommit off (set by an
	// implicit begin, cleared before a statement outside a transaction).
	autocommitOff bool
	// inTx: a transaction begun on the connection has not ended yet.
	inTx bool
}

var _ mysqlDriverConn = (*mysqlFencingConn)(nil)

// BeginTx begins a transaction as go-sql-driver/mysql does, or, asked by
// BeginFenced (a default or READ WRITE transaction), with nothing sent
// when the session's autocommit is off already, else after turning it
// off: the next statement, the fence's read, opens the transaction.
func (fc *mysqlFencingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if ctx.Value(implicitBeginKey{}) == nil || opts.ReadOnly {
		tx, err := fc.c.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		fc.inTx = true
		return &mysqlTx{fc: fc, tx: tx}, nil
	}
	if !fc.c.IsValid() {
		return nil, driver.ErrBadConn
	}
	if !fc.autocommitOff {
		if _, err := fc.c.ExecContext(ctx, "SET autocommit = 0", nil); err != nil {
			return nil, err
		}
		fc.autocommitOff = true
	}
	if sql.IsolationLevel(opts.Isolation) != sql.LevelDefault {
		level, err := mysqlIsolation(sql.IsolationLevel(opts.Isolation))
		if err != nil {
			return nil, err
		}
		// Applies to the next transaction, begun explicitly or not.
		if _, err := fc.c.ExecContext(ctx, "SET TRANSACTION ISOLATION LEVEL "+level, nil); err != nil {
			return nil, err
		}
	}
	fc.inTx = true
	return &mysqlTx{fc: fc}, nil
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
	return "", fmt.Errorf("cluster.BeginFenced: MySQL has no isolation level %v", l)
}

// autocommit turns the session's autocommit back on before a statement
// outside a transaction, which would otherwise open one that nothing
// commits.
func (fc *mysqlFencingConn) autocommit(ctx context.Context) error {
	if !fc.autocommitOff || fc.inTx {
		return nil
	}
	if _, err := fc.c.ExecContext(ctx, "SET autocommit = 1", nil); err != nil {
		return err
	}
	fc.autocommitOff = false
	return nil
}

func (fc *mysqlFencingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := fc.autocommit(ctx); err != nil {
		return nil, err
	}
	return fc.c.ExecContext(ctx, query, args)
}

func (fc *mysqlFencingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := fc.autocommit(ctx); err != nil {
		return nil, err
	}
	return fc.c.QueryContext(ctx, query, args)
}

func (fc *mysqlFencingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := fc.c.PrepareContext(ctx, query)
	if err != nil {
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

func (fc *mysqlFencingConn) Close() error                           { return fc.c.Close() }
func (fc *mysqlFencingConn) Ping(ctx context.Context) error         { return fc.c.Ping(ctx) }
func (fc *mysqlFencingConn) ResetSession(ctx context.Context) error { return fc.c.ResetSession(ctx) }
func (fc *mysqlFencingConn) IsValid() bool                          { return fc.c.IsValid() }
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
	case t.tx == nil:
		_, err := fc.c.ExecContext(context.Background(), stmt, nil)
		return err
	case stmt == "COMMIT":
		return t.tx.Commit()
	default:
		return t.tx.Rollback()
	}
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
	return s.s.ExecContext(ctx, args)
}

func (s *mysqlStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := s.fc.autocommit(ctx); err != nil {
		return nil, err
	}
	return s.s.QueryContext(ctx, args)
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
