package cluster

// The DBProvider over a database/sql pool: the pool and handle adapters,
// and the fence's reads prepared on the pool (MySQL, SQLite).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqlfence/cluster/internal/ownstmt"
	"github.com/sqlfence/cluster/provider"
)

// sqlQuerier adapts a database/sql handle to a Querier.
type sqlQuerier struct{ h sqlHandle }

func (q sqlQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.h.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q sqlQuerier) QueryRow(ctx context.Context, query string, args ...any) provider.Row {
	return q.h.QueryRowContext(ctx, query, args...)
}

func (q sqlQuerier) Query(ctx context.Context, query string, args ...any) (provider.Rows, error) {
	h, ok := q.h.(interface {
		QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	})
	if !ok {
		return nil, fmt.Errorf("cluster: %T cannot return rows", q.h)
	}
	return h.QueryContext(ctx, query, args...)
}

// rowIter reads the rows of a query on a connection of the provider.
type rowIter struct{ r provider.Rows }

func queryRows(ctx context.Context, conn provider.Querier, q string, args ...any) (*rowIter, error) {
	rq, ok := conn.(provider.RowsQuerier)
	if !ok {
		return nil, fmt.Errorf("%w: the Pool's connections (%T) cannot return rows: implement cluster.RowsQuerier", ErrInvalidConfig, conn)
	}
	r, err := rq.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return &rowIter{r}, nil
}

func (it *rowIter) next() bool             { return it.r.Next() }
func (it *rowIter) scan(dest ...any) error { return it.r.Scan(dest...) }
func (it *rowIter) close() error           { return errors.Join(it.r.Err(), it.r.Close()) }

// SQLPool returns the [provider.Pool] over a database/sql pool that [NewDBProvider]
// uses, for a Pool of another package to build on (clusterpgx adds LISTEN
// to it).
func SQLPool(db *sql.DB) provider.Pool { return sqlPool{db} }

// sqlPool is a Pool over a database/sql pool.
type sqlPool struct{ db *sql.DB }

// Conn takes a connection, telling an exhausted pool apart from a slow
// query. Its context is marked as the provider's own (ownstmt), so that
// a pool of clusterpgx.OpenDB skips pgx's liveness ping.
func (p sqlPool) Conn(ctx context.Context) (provider.Querier, func(), error) {
	conn, err := p.db.Conn(ownstmt.With(ctx))
	if err == nil {
		return sqlQuerier{conn}, func() { conn.Close() }, nil
	}
	if isContextErr(err) {
		if s := p.db.Stats(); s.MaxOpenConnections > 0 && s.InUse >= s.MaxOpenConnections {
			return nil, nil, fmt.Errorf("%w: all %d connections of the *sql.DB are in use (SetMaxOpenConns); raise the limit or shorten what holds them: %w",
				ErrPoolExhausted, s.MaxOpenConnections, err)
		}
	}
	return nil, nil, err
}

// A preparedFence is the fence's locked read, prepared once on the
// provider's *sql.DB (SQLite and MySQL: the provider prepares it at its
// first Fence for a TTL; pgx caches PostgreSQL's statements itself). Parsing it was two fifths of a fence's
// cost on SQLite, and go-sql-driver/mysql prepares, runs and closes a
// statement with arguments in two round trips unless the DSN sets
// interpolateParams=true; prepared, it is one on every connection that ran
// it before. On MySQL the read's text carries its time limit, which
// follows the context's deadline (fenceLimit), so there is one statement
// per limit fenceLimit gives from minPreparedFenceLimit to
// maxPreparedFenceLimit, and one for the TTL (eleven at most); another
// limit sends the text. Each connection prepares only the statements its
// fences run.
type preparedFence struct {
	stmts map[string]*sql.Stmt // by text
}

// minPreparedFenceLimit and maxPreparedFenceLimit bound the time limits
// of the fence reads the provider prepares, besides the TTL's: a fence with less
// time left is rare, and one with more, shorter than the TTL, too (a
// request's deadline is seconds).
const (
	minPreparedFenceLimit = 64 * time.Millisecond
	maxPreparedFenceLimit = 32768 * time.Millisecond
)

// fenceLimit is the time limit of a fence's read in ctx for a lease of
// ttl: ttl, or nine tenths of the time ctx has left when that is shorter,
// rounded down to a power of two milliseconds, so that the reads of all
// deadlines have few texts, each prepared once (a lock wait that would
// have lasted from the rounded limit to the deadline fails sooner).
func fenceLimit(ctx context.Context, ttl time.Duration) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return ttl
	}
	left := nineTenthsLeft(dl)
	if left >= ttl {
		return ttl
	}
	ms := left.Milliseconds()
	if ms <= 1 {
		return time.Millisecond
	}
	return time.Duration(1<<(bits.Len64(uint64(ms))-1)) * time.Millisecond
}

// prepareFence prepares p's fence read for leases of ttl on db, for every
// limit fenceLimit gives from minPreparedFenceLimit up, or returns nil
// when preparing fails (Fence then sends the text).
func (p *DBProvider) prepareFence(ctx context.Context, db *sql.DB, ttl time.Duration) *preparedFence {
	d, ok := p.d.(interface {
		fenceQuery(ttl, limit time.Duration) string
	})
	if !ok {
		return nil
	}
	f := &preparedFence{stmts: map[string]*sql.Stmt{}}
	limits := []time.Duration{ttl}
	for l := minPreparedFenceLimit; l < ttl && l <= maxPreparedFenceLimit; l *= 2 {
		limits = append(limits, l)
	}
	for _, l := range limits {
		q := d.fenceQuery(ttl, l)
		if f.stmts[q] != nil {
			continue // SQLite's read has no time limit: one text
		}
		stmt, err := db.PrepareContext(ctx, q)
		if err != nil {
			f.close()
			p.log.InfoContext(ctx, "cluster: preparing the fence's read failed; Fence sends its text each time, a little slower", "err", err)
			return nil
		}
		f.stmts[q] = stmt
	}
	return f
}

// preparedFor returns p's fence reads for leases of ttl, or nil while
// there are none: on PostgreSQL (pgx caches its statements), over another
// Pool, once p is closed, while they are being prepared, or when that
// failed. The first call for a TTL starts preparing them on a goroutine of
// p's own (Close waits for it), never in the caller's: a fence runs in a
// transaction that holds a connection, and preparing needs another, which
// a small pool may not have until the transaction ends. Meanwhile fences
// send the text, as they always may.
func (p *DBProvider) preparedFor(ttl time.Duration) *preparedFence {
	p.fenceMu.Lock()
	defer p.fenceMu.Unlock()
	if f, ok := p.fences[ttl]; ok || p.closed {
		return f
	}
	if p.fences == nil {
		p.fences = map[time.Duration]*preparedFence{}
		p.prepCtx, p.prepCancel = context.WithCancel(context.Background())
	}
	p.fences[ttl] = nil // being prepared
	sp, ok := p.pool.(sqlPool)
	if !ok || p.d.name() == Postgres {
		return nil
	}
	p.preparing.Add(1)
	go func() {
		defer p.preparing.Done()
		ctx, cancel := context.WithTimeout(p.prepCtx, prepareFenceWithin)
		defer cancel()
		f := p.prepareFence(ctx, sp.db, ttl)
		p.fenceMu.Lock()
		defer p.fenceMu.Unlock()
		if p.closed {
			if f != nil {
				f.close()
			}
			return
		}
		p.fences[ttl] = f
	}()
	return nil
}

// prepareFenceWithin bounds the preparation of the fence's reads.
const prepareFenceWithin = 10 * time.Second

// Close closes the statements p prepared (the fence's reads on MySQL and
// SQLite, over a *sql.DB), waiting for a preparation under way; it does
// not close the pool, and p keeps working, sending the statements' text. A
// Cluster closes the provider it built over [Config.DB] at Shutdown; close
// one you built yourself once no Cluster uses it.
func (p *DBProvider) Close() error {
	p.fenceMu.Lock()
	p.closed = true
	if p.prepCancel != nil {
		p.prepCancel()
	}
	p.fenceMu.Unlock()
	p.preparing.Wait()
	p.fenceMu.Lock()
	defer p.fenceMu.Unlock()
	for _, f := range p.fences {
		if f != nil {
			f.close()
		}
	}
	p.fences = nil
	return nil
}

// close closes f's statements; a transaction fenced meanwhile keeps its
// copy until it ends.
func (f *preparedFence) close() {
	for _, stmt := range f.stmts {
		stmt.Close()
	}
}

// errForeignStmt is what database/sql reports when a statement prepared on
// one *sql.DB is run in a transaction of another.
const errForeignStmt = "sql: Tx.Stmt: statement from different database used"

// preparedQuerier is sqlQuerier over a transaction, running the fence's
// read through its prepared statement (on the transaction's connection,
// prepared there once). A transaction of another *sql.DB than the
// provider's runs the text, as sqlQuerier does.
type preparedQuerier struct {
	sqlQuerier
	tx *sql.Tx
	f  *preparedFence
}

func (q preparedQuerier) QueryRow(ctx context.Context, query string, args ...any) provider.Row {
	prepared, ok := q.f.stmts[query]
	if !ok {
		return q.sqlQuerier.QueryRow(ctx, query, args...)
	}
	stmt := q.tx.StmtContext(ctx, prepared)
	return preparedRow{stmt, stmt.QueryRowContext(ctx, args...), func() provider.Row {
		return q.sqlQuerier.QueryRow(ctx, query, args...)
	}}
}

// preparedRow is the row of the prepared read, or of the text when the
// statement belongs to another *sql.DB.
type preparedRow struct {
	stmt     *sql.Stmt // the transaction's copy, closed once read (else at its end)
	row      *sql.Row
	fallback func() provider.Row
}

func (r preparedRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.stmt.Close()
	if err != nil && (err.Error() == errForeignStmt || preparedStmtLimit(err)) {
		return r.fallback().Scan(dest...)
	}
	return err
}

// preparedStmtLimit reports whether err is MySQL's refusal to prepare one
// more statement (max_prepared_stmt_count, for the whole server): the
// transaction's copy of the read could not be prepared on its connection,
// and the text still runs.
func preparedStmtLimit(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1461
}
