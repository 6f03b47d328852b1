package clusterpgx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/fencedbegin"
	"github.com/sqlfence/cluster/internal/ownstmt"
	"github.com/sqlfence/cluster/provider"
)

// NewStdlibProvider returns the default provider over db, a database/sql
// pool of pgx's stdlib driver, that also hears lease releases through
// LISTEN on a raw connection of db, so followers take over at once rather
// than at their next poll. [cluster.NewDBProvider] over the same db polls.
// An empty tablePrefix means "cluster_".
func NewStdlibProvider(db *sql.DB, tablePrefix string) (*cluster.DBProvider, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: clusterpgx.NewStdlibProvider needs a *sql.DB", cluster.ErrInvalidConfig)
	}
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil, fmt.Errorf("%w: clusterpgx.NewStdlibProvider needs a *sql.DB of pgx's stdlib driver, not %T", cluster.ErrInvalidConfig, db.Driver())
	}
	return cluster.NewSQLProvider(stdlibPool{cluster.SQLPool(db), db}, cluster.Postgres, tablePrefix)
}

// stdlibPool is cluster's database/sql pool that can also LISTEN.
type stdlibPool struct {
	provider.Pool
	db *sql.DB
}

var _ provider.ListenPool = stdlibPool{}

// Listen implements [provider.ListenPool] on a connection of db, which it
// stops listening (UNLISTEN *) before giving it back.
func (p stdlibPool) Listen(ctx context.Context, channel string, ready func(), notify func(string)) error {
	conn, err := p.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("clusterpgx: a connection of %T cannot LISTEN", dc)
		}
		pc := sc.Conn()
		err := listen(ctx, pc, channel, ready, notify)
		if !pc.IsClosed() {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if _, uerr := pc.Exec(uctx, "UNLISTEN *"); uerr != nil {
				pc.Close(uctx) // database/sql discards a closed connection
			}
		}
		return err
	})
}

// OpenDB opens a database/sql pool of pgx's stdlib driver on config, as
// stdlib.OpenDB does with the same options, whose connections can begin a
// transaction and fence it in one round trip: [cluster.Cluster.BeginFenced]
// on it sends the BEGIN
// and the fence's locked read of the lease row together, as [BeginFenced]
// does on pgx. Everything else behaves as on stdlib.OpenDB's
// pool; the one difference is the value [sql.Conn.Raw] hands its function:
// not a *stdlib.Conn but a value that embeds one, so code that needs the
// *pgx.Conn asserts interface{ Conn() *pgx.Conn }, which both have.
//
// Before the statements a provider over the pool makes on its own account
// (lease, membership, lanes), its connections skip pgx's liveness ping,
// which pgx sends before reusing a connection idle for over a second: a
// listening follower makes one statement per LeaseTTL, and the ping would
// double its cost to the server. The provider retries a statement that
// fails on a dead connection at its next step. An [stdlib.OptionShouldPing]
// in opts replaces this choice for every statement.
func OpenDB(config pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
	opts = append([]stdlib.OptionOpenDB{stdlib.OptionShouldPing(shouldPing)}, opts...)
	return sql.OpenDB(fencingConnector{stdlib.GetConnector(config, opts...)})
}

// shouldPing is pgx's rule (ping a connection idle for over a second),
// except before a provider's own statement.
func shouldPing(ctx context.Context, p stdlib.ShouldPingParams) bool {
	return ownstmt.ShouldPing(ctx, p.IdleDuration)
}

// OpenDBFromPool is [OpenDB] over a pgxpool, as stdlib.OpenDBFromPool: each
// database/sql connection is one of pool's, and database/sql keeps none idle.
func OpenDBFromPool(pool *pgxpool.Pool, opts ...stdlib.OptionOpenDB) *sql.DB {
	db := sql.OpenDB(fencingConnector{stdlib.GetPoolConnector(pool, opts...)})
	db.SetMaxIdleConns(0)
	return db
}

// fencingConnector is pgx's stdlib connector whose connections are
// fencingConns; Driver is stdlib's, so the pool is pgx's to everyone who
// asks (cluster's dialect detection, NewStdlibProvider).
type fencingConnector struct{ driver.Connector }

func (fc fencingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := fc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		return dc, nil
	}
	return &fencingConn{sc}, nil
}

// A fencingConn is a connection of pgx's stdlib driver (every method but
// BeginTx is its, Conn included: the embedded field is named stdConn so
// that it does not hide that method) that begins a transaction of
// cluster.BeginFenced with the fence in the same batch.
type fencingConn struct{ *stdConn }

type stdConn = stdlib.Conn

// fencingConn is everything database/sql asks of *stdlib.Conn.
var (
	_ driver.ConnBeginTx            = (*fencingConn)(nil)
	_ driver.ConnPrepareContext     = (*fencingConn)(nil)
	_ driver.ExecerContext          = (*fencingConn)(nil)
	_ driver.QueryerContext         = (*fencingConn)(nil)
	_ driver.Pinger                 = (*fencingConn)(nil)
	_ driver.SessionResetter        = (*fencingConn)(nil)
	_ driver.NamedValueChecker      = (*fencingConn)(nil)
	_ interface{ Conn() *pgx.Conn } = (*fencingConn)(nil)
)

// BeginTx begins a transaction as stdlib does, or, asked by
// cluster.BeginFenced, begins and fences it in one batch (BeginFenced on the
// connection), which on error leaves no transaction open.
func (fc *fencingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	req := fencedbegin.From(ctx)
	if req == nil {
		return fc.stdConn.BeginTx(ctx, opts)
	}
	c, ok := req.Fencer.(*cluster.Cluster)
	if !ok || c == nil {
		return fc.stdConn.BeginTx(ctx, opts) // not a request it knows how to answer
	}
	pc := fc.Conn()
	if pc.IsClosed() {
		return nil, driver.ErrBadConn
	}
	var pgxOpts pgx.TxOptions
	switch sql.IsolationLevel(opts.Isolation) {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		pgxOpts.IsoLevel = pgx.ReadUncommitted
	case sql.LevelReadCommitted:
		pgxOpts.IsoLevel = pgx.ReadCommitted
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		pgxOpts.IsoLevel = pgx.RepeatableRead
	case sql.LevelSerializable:
		pgxOpts.IsoLevel = pgx.Serializable
	default:
		return nil, fmt.Errorf("%w: cluster.BeginFenced: PostgreSQL has no isolation level %v; it has read uncommitted (run as read committed), read committed, repeatable read (sql.LevelSnapshot too) and serializable", cluster.ErrInvalidConfig, sql.IsolationLevel(opts.Isolation))
	}
	if opts.ReadOnly {
		pgxOpts.AccessMode = pgx.ReadOnly
	}
	// The request is this call's: a Fencer that began a transaction of
	// its own on this pool, in the context it is given, begins a plain one.
	tx, token, err := BeginFenced(fencedbegin.With(ctx, nil), c, pc, pgxOpts)
	if err != nil {
		return nil, err
	}
	req.Fenced, req.Token = true, token
	return fencedTx{ctx, tx}, nil
}

// fencedTx is the driver.Tx of a transaction BeginFenced began, ended in
// the context it began in, as stdlib's transactions are.
type fencedTx struct {
	ctx context.Context
	tx  pgx.Tx
}

func (t fencedTx) Commit() error   { return t.tx.Commit(t.ctx) }
func (t fencedTx) Rollback() error { return t.tx.Rollback(t.ctx) }
