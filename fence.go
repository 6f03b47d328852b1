package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// DBTX is what [Cluster.Fence] and [Cluster.AdvanceTip] need of a database
// handle. *sql.Tx, *sql.Conn and *sql.DB satisfy it; only a transaction
// makes the fence hold until the writes commit.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ DBTX = (*sql.Tx)(nil)
	_ DBTX = (*sql.Conn)(nil)
	_ DBTX = (*sql.DB)(nil)
)

// errNoDatabase is returned by the calls that need the lease row in
// Config.DB when a custom Provider holds the lease instead.
var errNoDatabase = fmt.Errorf("%w: Fence, AdvanceTip, Chains and vault keys need the lease in Config.DB; a custom Provider cannot provide them", ErrInvalidConfig)

// Fence verifies, inside the caller's transaction tx, that this node's
// fencing token is the token of the current, unexpired lease, and holds that
// fact until tx ends: on PostgreSQL with a FOR SHARE lock on the lease row,
// on MySQL and MariaDB with LOCK IN SHARE MODE, and on SQLite through its
// serializable transactions. No later term can be granted until tx commits
// or rolls back, so every committed write fenced with token T commits before
// any acquisition of a token above T. A stale or expired token returns an
// error wrapping [ErrStaleFencingToken], which also matches [ErrNotLeader].
//
// Call Fence first in the transaction, before the writes it guards:
//
//	tx, _ := db.BeginTx(ctx, nil)
//	defer tx.Rollback()
//	if err := c.Fence(ctx, tx); err != nil {
//		return err // not the leader any more: nothing was written
//	}
//	// ... writes ...
//	return tx.Commit()
//
// Cost: one round trip, a primary-key read. Caveat: while a fenced
// transaction is open, the lease row cannot be renewed or acquired, so keep
// fenced transactions short. A transaction left open delays a takeover, and
// this node's own renew, until it ends; bound it with the server's timeouts
// (PostgreSQL idle_in_transaction_session_timeout and lock_timeout,
// MySQL innodb_lock_wait_timeout and wait_timeout) and with ctx. Outside a
// transaction (tx an *sql.DB) Fence is only a check of the moment.
//
// On SQLite, open the database with _txlock=immediate so that a fenced
// transaction takes the write lock when it begins; in a deferred
// transaction a later acquisition can still commit between Fence and the
// first write, and the stale write then fails with SQLITE_BUSY rather than
// ErrStaleFencingToken (it still fails).
func (c *Cluster) Fence(ctx context.Context, tx DBTX) error {
	_, err := c.FenceToken(ctx, tx)
	return err
}

// FenceToken is [Cluster.Fence] that also returns the fencing token it
// verified, for the caller to store with the rows it writes in tx. Read
// the token here rather than from [Cluster.FencingToken], which may already
// describe a later term.
func (c *Cluster) FenceToken(ctx context.Context, tx DBTX) (uint64, error) {
	if c.db == nil {
		return 0, errNoDatabase
	}
	t, err := c.heldTerm()
	if err != nil {
		return 0, err
	}
	if err := c.db.fence(ctx, tx, t.lease, c.cfg.LeaseTTL); err != nil {
		return 0, err
	}
	return t.lease.FencingToken, nil
}

// fence checks l against the lease row in tx, locking the row for share.
// It bounds, on the server, the wait for the lock and how long tx may then
// idle, both by ttl: a fenced transaction whose client vanished must not
// hold the lease row, and so every takeover, until the server notices the
// dead connection hours later.
//
// PostgreSQL sets both bounds for the rest of the transaction (set_config
// with is_local). MariaDB's idle_transaction_timeout is a session
// variable: it stays set on the connection after the transaction ends.
// MySQL 8 has no such variable; see the README for what to set there.
func (p *dbProvider) fence(ctx context.Context, tx DBTX, l Lease, ttl time.Duration) error {
	q := p.q["fence"]
	if p.dialect == MySQL {
		limit := ttl
		if dl, ok := ctx.Deadline(); ok {
			limit = min(limit, time.Until(dl)*9/10)
		}
		q = mysqlBounded(q, limit, p.mariadb)
		if p.mariadb {
			secs := int64((ttl + time.Second - 1) / time.Second)
			if _, err := tx.ExecContext(ctx, "SET SESSION idle_transaction_timeout = ?", secs); err != nil {
				return p.wrap("fence lease "+quote(l.Name)+": bound the transaction's idle time", err)
			}
		}
	}
	var r row
	err := tx.QueryRowContext(ctx, q, l.Name, strconv.FormatInt(ttl.Milliseconds(), 10)).
		Scan(&r.holder, &r.instance, &r.token, &r.expiresAt, &r.endpoint, &r.now)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: lease %q does not exist", ErrStaleFencingToken, l.Name)
	}
	if err != nil {
		return p.wrap("fence lease "+quote(l.Name), err)
	}
	switch {
	case r.token != int64(l.FencingToken) || r.instance != l.Instance:
		return fmt.Errorf("%w: fencing token %d of node %q is stale; lease %q is now held by node %q with token %d",
			ErrStaleFencingToken, l.FencingToken, l.Holder, l.Name, r.holder, r.token)
	case r.expiresAt <= r.now:
		return fmt.Errorf("%w: the lease %q of node %q with fencing token %d expired %dms ago by the database clock",
			ErrStaleFencingToken, l.Name, l.Holder, l.FencingToken, r.now-r.expiresAt)
	}
	return nil
}
