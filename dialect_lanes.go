package cluster

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// laneDialect is what the dialects do differently for lanes and the config
// version: each claims, renews and bumps in the fewest statements it can.
// Every dialect implements it.
type laneDialect interface {
	// claimLane runs the claim in tx: whether it was granted, and the
	// lane row after it when it was. Not granted says nothing of the row,
	// which the caller reads.
	claimLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest, limit time.Duration) (granted bool, r laneRow, err error)
	// refreshLanes renews the instance's unexpired lanes and returns the
	// report rows that lane_report describes.
	refreshLanes(ctx context.Context, conn provider.Querier, scope, instance string, ttl, window time.Duration) (*rowIter, error)
	// bumpConfig increments the config version of scope and returns it.
	bumpConfig(ctx context.Context, conn provider.Querier, scope string) (int64, error)
}

var (
	_ laneDialect = (*postgres)(nil)
	_ laneDialect = (*mySQL)(nil)
	_ laneDialect = (*sqlite)(nil)
)

// pgLaneQueries are PostgreSQL's own lane statements.
type pgLaneQueries struct {
	LaneRefresh string `sql:"lane_refresh"` // ttl ms, scope, instance, window ms
}

// laneRenewQueries are the lane heartbeat of the dialects that cannot
// renew and report in one statement.
type laneRenewQueries struct {
	LaneRenew  string `sql:"lane_renew"`  // ttl ms, scope, instance
	LaneReport string `sql:"lane_report"` // scope, window ms, scope, instance, window ms, scope, scope, instance
}

// laneRow is a lane row as lane_claim and lane_read return it; times are
// unix milliseconds by the database clock.
type laneRow struct {
	holder, instance                       string
	token, acquired, renewed, expires, now int64
}

func (r *laneRow) scan(s provider.Row) error {
	return s.Scan(&r.holder, &r.instance, &r.token, &r.acquired, &r.renewed, &r.expires, &r.now)
}

func (r laneRow) lane(key string) Lane {
	return Lane{Key: key, Holder: r.holder, Instance: r.instance, FencingToken: uint64(r.token),
		AcquiredAt: time.UnixMilli(r.acquired), RenewedAt: time.UnixMilli(r.renewed), ExpiresAt: time.UnixMilli(r.expires),
		Remaining: time.Duration(r.expires-r.now) * time.Millisecond}
}

func (r laneRow) held(key string) *LaneHeldError {
	return &LaneHeldError{Lane: key, Holder: r.holder, Instance: r.instance, FencingToken: uint64(r.token),
		ExpiresAt: time.UnixMilli(r.expires), Remaining: time.Duration(r.expires-r.now) * time.Millisecond}
}

// claimReturning runs a lane_claim that returns the row it claimed, or none.
func claimReturning(ctx context.Context, tx provider.Querier, q string, req provider.LaneRequest, timeout any) (bool, laneRow, error) {
	var r laneRow
	err := r.scan(tx.QueryRow(ctx, q, req.Holder, req.Instance, req.TTL.Milliseconds(), req.Scope, req.Key, req.Instance, timeout))
	if errors.Is(err, sql.ErrNoRows) {
		return false, r, nil
	}
	return err == nil, r, err
}

// PostgreSQL bounds the wait for the lane row and the transaction's idle
// time in the claim itself, as fence does.
func (d *postgres) claimLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest, limit time.Duration) (bool, laneRow, error) {
	return claimReturning(ctx, tx, d.q.LaneClaim, req, strconv.FormatInt(max(limit, time.Millisecond).Milliseconds(), 10))
}

// refreshLanes renews and reports in one statement, which skips the lanes
// a transaction of this node holds (its claim renewed them).
func (d *postgres) refreshLanes(ctx context.Context, conn provider.Querier, scope, instance string, ttl, window time.Duration) (*rowIter, error) {
	return queryRows(ctx, conn, d.q.LaneRefresh, ttl.Milliseconds(), scope, instance, window.Milliseconds())
}

func (d *postgres) bumpConfig(ctx context.Context, conn provider.Querier, scope string) (int64, error) {
	var v int64
	err := conn.QueryRow(ctx, d.q.ConfigBump, scope).Scan(&v)
	return v, err
}

func (d *sqlite) claimLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest, limit time.Duration) (bool, laneRow, error) {
	return claimReturning(ctx, tx, d.q.LaneClaim, req, limit.Milliseconds())
}

func (d *sqlite) refreshLanes(ctx context.Context, conn provider.Querier, scope, instance string, ttl, window time.Duration) (*rowIter, error) {
	return renewThenReport(ctx, conn, d.q.LaneRenew, d.q.LaneReport, scope, instance, ttl, window)
}

func (d *sqlite) bumpConfig(ctx context.Context, conn provider.Querier, scope string) (int64, error) {
	var v int64
	err := conn.QueryRow(ctx, d.q.ConfigBump, scope).Scan(&v)
	return v, err
}

// claimLane bounds the wait for the lane row on the server and, on
// MariaDB, the transaction's idle time, as fence does; MySQL has no
// RETURNING, so a granted claim is read back in tx, which sees its own
// write.
func (d *mySQL) claimLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest, limit time.Duration) (bool, laneRow, error) {
	var r laneRow
	if d.mariadb {
		if _, err := tx.Exec(ctx, d.idleTimeout(req.TTL)); err != nil {
			return false, r, err
		}
	}
	n, err := tx.Exec(ctx, d.bound(d.q.LaneClaim, limit), req.Holder, req.Instance, req.TTL.Milliseconds(),
		req.Scope, req.Key, req.Instance, limit.Milliseconds())
	if err != nil || n != 1 {
		return false, r, err
	}
	if err := r.scan(tx.QueryRow(ctx, d.q.LaneRead, req.Scope, req.Key)); err != nil {
		return false, r, err
	}
	return r.instance == req.Instance, r, nil
}

func (d *mySQL) refreshLanes(ctx context.Context, conn provider.Querier, scope, instance string, ttl, window time.Duration) (*rowIter, error) {
	return renewThenReport(ctx, conn, d.bound(d.q.LaneRenew, statementLimit(ctx)), d.q.LaneReport, scope, instance, ttl, window)
}

// bumpConfig increments in one statement, which leaves the new version in
// LAST_INSERT_ID for this connection to read.
func (d *mySQL) bumpConfig(ctx context.Context, conn provider.Querier, scope string) (int64, error) {
	if _, err := conn.Exec(ctx, d.bound(d.q.ConfigBump, statementLimit(ctx)), scope); err != nil {
		return 0, err
	}
	var v int64
	err := conn.QueryRow(ctx, d.q.LastInsertID).Scan(&v)
	return v, err
}

// renewThenReport is the lane heartbeat in two statements: one UPDATE
// renewing every unexpired lane of the instance, then the report.
func renewThenReport(ctx context.Context, conn provider.Querier, renew, report, scope, instance string, ttl, window time.Duration) (*rowIter, error) {
	if _, err := conn.Exec(ctx, renew, ttl.Milliseconds(), scope, instance); err != nil {
		return nil, err
	}
	w := window.Milliseconds()
	return queryRows(ctx, conn, report, scope, w, scope, instance, w, scope, scope, instance)
}
