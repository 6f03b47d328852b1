package cluster

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sqlfence/cluster/internal/fencedbegin"
	"github.com/sqlfence/cluster/provider"
)

// A Tx is the transaction that [Cluster.Fence], [Cluster.AdvanceTip] and
// [Cluster.ClaimLane] work in: a *sql.Tx (or a *sql.Conn, in a transaction
// it began), or a transaction of another driver through an adapter that
// also implements [provider.Querier]: clusterpgx.Tx(tx) for a pgx.Tx.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// sqlHandle is what a database/sql handle does: *sql.Tx, *sql.Conn and
// *sql.DB.
type sqlHandle interface {
	Tx
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ sqlHandle = (*sql.Tx)(nil)
	_ sqlHandle = (*sql.Conn)(nil)
	_ sqlHandle = (*sql.DB)(nil)
)

// querierOf returns the Querier that runs call's statements in tx, or an
// error wrapping ErrInvalidConfig for a tx that is nil or that cannot read
// rows. It is checked before call changes anything or asks whether this
// node leads.
func querierOf(call string, tx Tx) (provider.Querier, error) {
	if tx == nil || nilSQLHandle(tx) {
		return nil, errNilTx(call, tx)
	}
	if q, ok := tx.(provider.Querier); ok {
		return q, nil
	}
	h, ok := tx.(sqlHandle)
	if !ok {
		return nil, fmt.Errorf("%w: %s cannot read rows through a %T: pass a *sql.Tx, or a transaction of another driver through its adapter (clusterpgx.Tx for pgx)", ErrInvalidConfig, call, tx)
	}
	return sqlQuerier{h}, nil
}

// nilSQLHandle reports whether h is a nil *sql.Tx, *sql.Conn or *sql.DB,
// whose methods would dereference nil.
func nilSQLHandle(h any) bool {
	switch t := h.(type) {
	case *sql.Tx:
		return t == nil
	case *sql.Conn:
		return t == nil
	case *sql.DB:
		return t == nil
	}
	return false
}

// Fence verifies, inside the caller's transaction tx, that this node's
// fencing token is the token of the current, unexpired lease, holds that
// fact until tx ends, and returns the token, for the caller to store with
// the rows it writes in tx (read it here rather than from
// [Cluster.FencingToken], which may already describe a later term).
//
// It holds the fact on PostgreSQL with a FOR SHARE lock on the lease row,
// on MySQL and MariaDB with LOCK IN SHARE MODE, and on SQLite through its
// serializable transactions: no later term can be granted until tx commits
// or rolls back, so every committed write fenced with token T commits
// before any acquisition of a token above T. A stale or expired token
// returns an error wrapping [ErrStaleFencingToken], which also matches
// [ErrNotLeader].
//
// Call Fence first in the transaction, before the writes it guards:
//
//	tx, _ := db.BeginTx(ctx, nil)
//	defer tx.Rollback()
//	token, err := c.Fence(ctx, tx)
//	if err != nil {
//		return err // not the leader any more: nothing was written
//	}
//	// ... writes, storing token ...
//	return tx.Commit()
//
// Cost: a primary-key read, locked for share, in a round trip of its own
// (on a MariaDB connection that never fenced, three statements, as it
// first bounds the session's idle time: before the row is locked, so that
// no wait for the client is unbounded while it is held; none of its own
// with pgx's clusterpgx.BeginFenced, which sends it with the BEGIN). On
// SQLite and MySQL, in a transaction of the *sql.DB the Cluster was given
// (Config.DB), the read runs through a statement the provider prepared at
// its first Fence, which spares SQLite parsing it and go-sql-driver/mysql
// a prepare round trip per call. On MySQL the read's time limit follows
// ctx's deadline: nine tenths of what is left, when that is under
// LeaseTTL, rounded down to a power of two milliseconds (the provider
// prepares one statement per limit from 64 ms to about 33 s and one for
// LeaseTTL; a fence with another limit sends the text). While a fenced
// transaction is open the lease row cannot be renewed or acquired, so
// keep fenced transactions
// short: Fence bounds, on the server, the wait for the lease row and how
// long the transaction may then sit idle, both by [Config.LeaseTTL], so a
// client that vanishes mid-transaction blocks a takeover for about one
// LeaseTTL (see docs/guarantees.md for each dialect). Outside a transaction (tx an
// *sql.DB) Fence is only a check of the moment.
//
// A statement that ends the transaction early (DDL, LOCK TABLES, a
// deadlock on MySQL, which rolls the transaction back) ends the fence with
// it: roll back and retry rather than write on.
//
// On SQLite, open the database with _txlock=immediate so that a fenced
// transaction takes the write lock when it begins; in a deferred
// transaction a later acquisition can still commit between Fence and the
// first write, and the stale write then fails with SQLITE_BUSY rather than
// ErrStaleFencingToken (it still fails).
func (c *Cluster) Fence(ctx context.Context, tx Tx) (uint64, error) {
	if c.isDefault() {
		return stdFence(ctx, tx)
	}
	q, err := querierOf("Fence", tx)
	if err != nil {
		return 0, err
	}
	if c.fencer == nil {
		return 0, c.errNoCapability("Fence", "Fencer")
	}
	t, err := c.heldTerm()
	if err != nil {
		return 0, err
	}
	start := mono()
	err = c.fencer.Fence(ctx, q, t.lease, c.cfg.LeaseTTL)
	c.record(OpFence, start, err)
	if err != nil {
		return 0, err
	}
	return t.lease.FencingToken, nil
}

// errNilTx reports a call given no transaction: nil, or a nil pointer of
// a type that would be one.
func errNilTx(call string, tx any) error {
	given := "nil"
	if tx != nil {
		given = fmt.Sprintf("a nil %T", tx)
	}
	return fmt.Errorf("%w: %s needs the transaction to work in; it was given %s", ErrInvalidConfig, call, given)
}

// nilQuerier reports whether q is nil or adapts a nil database/sql
// handle: the provider's own check, for a caller that passes a Querier
// directly rather than through a Cluster.
func nilQuerier(q provider.Querier) (bool, any) {
	switch t := q.(type) {
	case nil:
		return true, nil
	case sqlQuerier:
		return t.h == nil || nilSQLHandle(t.h), t.h
	}
	return false, nil
}

// checkQuerier is nilQuerier as an error for call.
func checkQuerier(call string, q provider.Querier) error {
	if isNil, given := nilQuerier(q); isNil {
		return errNilTx(call, given)
	}
	return nil
}

// errNoCapability reports a call that needs a capability the provider
// lacks.
func (c *Cluster) errNoCapability(call, capability string) error {
	return fmt.Errorf("%w: %s needs a provider that implements provider.%s; %T does not (a wrapper keeps every capability of *cluster.DBProvider by embedding it or by delegating each method)",
		ErrInvalidConfig, call, capability, c.provider)
}

// BeginFenced begins a database/sql transaction on db with opts (nil: the
// defaults), fences it as [Cluster.Fence] does, and returns the
// transaction, for the caller to commit or roll back, and the token of
// the term it verified, for the rows the transaction writes. On a pool
// opened by clusterpgx.OpenDB or OpenDBFromPool the BEGIN and the fence
// go to PostgreSQL in one batch; on any other *sql.DB it is db.BeginTx
// followed by Fence, one round trip more (on MySQL and MariaDB the fence
// costs that round trip: see docs/usage.md, "With MySQL or MariaDB").
//
// On error no transaction is left open: when this node does not lead, or
// its token is stale (errors.Is(err, ErrStaleFencingToken)), nothing was
// written. On [Default] when [Init] was never called it begins the
// transaction and returns token 0.
//
//	tx, token, err := c.BeginFenced(ctx, db, nil)
//	if err != nil {
//		return err
//	}
//	defer tx.Rollback()
//	// ... writes, storing token ...
//	return tx.Commit()
func (c *Cluster) BeginFenced(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, uint64, error) {
	if c == nil {
		// A member never made (New's error ignored, or a handler run
		// before it returned).
		return nil, 0, fmt.Errorf("%w: Cluster.BeginFenced called on a nil *Cluster; use the one New returned, or cluster.Default()", ErrInvalidConfig)
	}
	if db == nil {
		return nil, 0, fmt.Errorf("%w: Cluster.BeginFenced needs the *sql.DB to begin on; it was given nil", ErrInvalidConfig)
	}
	// A connection of clusterpgx.OpenDB fences as it begins.
	req := &fencedbegin.Request{Fencer: c}
	tx, err := db.BeginTx(fencedbegin.With(ctx, req), opts)
	if err != nil {
		return nil, 0, err
	}
	if req.Fenced {
		return tx, req.Token, nil
	}
	token, err := c.Fence(ctx, tx)
	if err != nil {
		tx.Rollback()
		return nil, 0, err
	}
	return tx, token, nil
}
