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

var (
	_ provider.LaneStore   = (*DBProvider)(nil)
	_ provider.ConfigStore = (*DBProvider)(nil)
)

// laneID names a lane: its scope and key.
type laneID struct{ scope, key string }

// maxLaneRows bounds a provider's laneRowSet.
const maxLaneRows = 4096

// A laneRowSet is a set of lanes that forgets them all when it is full: it
// only spares a claim the statement that creates the lane's row, so
// forgetting costs one such statement per lane claimed again, and memory
// stays bounded however many keys a service uses.
type laneRowSet struct {
	mu   sync.Mutex
	seen map[laneID]struct{}
}

func (s *laneRowSet) has(id laneID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.seen[id]
	return ok
}

func (s *laneRowSet) add(id laneID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil || len(s.seen) >= maxLaneRows {
		s.seen = make(map[laneID]struct{})
	}
	s.seen[id] = struct{}{}
}

func (p *DBProvider) lanes() laneDialect { return p.d.(laneDialect) }

// PeekLane implements [provider.LaneStore].
func (p *DBProvider) PeekLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest, window time.Duration) (*Lane, provider.LaneCensus, error) {
	if err := checkQuerier("ClaimLane", tx); err != nil {
		return nil, provider.LaneCensus{}, err
	}
	var c provider.LaneCensus
	var holder, instance sql.NullString
	var token, acquired, renewed, expires sql.NullInt64
	var lanes, mine, members, elders, now int64
	var loads sql.NullString
	w := window.Milliseconds()
	err := tx.QueryRow(ctx, p.q.LanePeek, req.Scope, w, req.Scope, req.Instance, req.Scope, req.Instance, w,
		req.Instance, req.Scope, req.Holder, w, req.Instance, req.Scope, req.Instance, w, req.Scope, req.Key).
		Scan(&holder, &instance, &token, &acquired, &renewed, &expires, &lanes, &mine, &members, &elders, &loads, &now)
	if err != nil {
		return nil, c, p.wrap("read lane "+quote(req.Key), err)
	}
	c = provider.LaneCensus{Lanes: int(lanes), Mine: int(mine), Members: int(members), Elders: int(elders), Loads: parseLoads(loads.String)}
	if !token.Valid {
		return nil, c, nil
	}
	l := laneRow{holder: holder.String, instance: instance.String, token: token.Int64,
		acquired: acquired.Int64, renewed: renewed.Int64, expires: expires.Int64, now: now}.lane(req.Key)
	return &l, c, nil
}

// ClaimLane implements [provider.LaneStore]. The claim is a conditional UPDATE in
// tx, whose row lock (PostgreSQL, MySQL) or write lock (SQLite) holds it
// until tx ends; a lane never claimed first gets a free row, token 0.
// Like [DBProvider.Fence], it bounds on the server the wait for the lane
// row and how long tx may then idle, by the TTL.
//
// The first claim of a lane by this provider creates its row (if absent)
// before the UPDATE: on MySQL an UPDATE that finds no row locks the gap
// where it would be, and two transactions that then both insert it
// deadlock. Rows are never deleted, so a lane seen once needs no more.
func (p *DBProvider) ClaimLane(ctx context.Context, tx provider.Querier, req provider.LaneRequest) (Lane, error) {
	if err := checkQuerier("ClaimLane", tx); err != nil {
		return Lane{}, err
	}
	limit := req.TTL
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, nineTenthsLeft(dl))
	}
	op := "claim lane " + quote(req.Key)
	id := laneID{req.Scope, req.Key}
	if !p.laneRows.has(id) {
		if _, err := tx.Exec(ctx, p.d.bound(p.q.LaneCreate, limit), req.Scope, req.Key); err != nil {
			return Lane{}, p.wrap(op, err)
		}
	}
	var r laneRow
	for attempt := 0; attempt < 3; attempt++ {
		granted, got, err := p.lanes().claimLane(ctx, tx, req, limit)
		if err != nil {
			return Lane{}, p.wrap(op, err)
		}
		if granted {
			p.laneRows.add(id)
			return got.lane(req.Key), nil
		}
		err = r.scan(tx.QueryRow(ctx, p.q.LaneRead, req.Scope, req.Key))
		if errors.Is(err, sql.ErrNoRows) {
			if _, err := tx.Exec(ctx, p.d.bound(p.q.LaneCreate, limit), req.Scope, req.Key); err != nil {
				return Lane{}, p.wrap(op, err)
			}
			continue
		}
		if err != nil {
			return Lane{}, p.wrap(op, err)
		}
		p.laneRows.add(id)
		if r.expires > r.now {
			return Lane{}, r.held(req.Key)
		}
		// Refused, yet the row read back is free: another claim changed it
		// after this transaction's snapshot. Try again; a transaction that
		// cannot see it (MySQL's repeatable read) reports the row it sees.
	}
	return Lane{}, r.held(req.Key)
}

// RenewLanes implements [provider.LaneStore]: one statement on PostgreSQL (which
// skips the lanes this instance's own transactions hold: their claims
// renewed them), an UPDATE and a read elsewhere.
func (p *DBProvider) RenewLanes(ctx context.Context, scope, instance string, ttl, window time.Duration) (provider.LaneReport, error) {
	var rep provider.LaneReport
	conn, release, err := p.conn(ctx)
	if err != nil {
		return rep, err
	}
	defer release()
	rows, err := p.lanes().refreshLanes(ctx, conn, scope, instance, ttl, window)
	if err != nil {
		return rep, p.wrap("renew lanes", err)
	}
	for rows.next() {
		var lanes, members, now int64
		var version, token, acquired, expires sql.NullInt64
		var key, loads sql.NullString
		if err := rows.scan(&lanes, &members, &loads, &version, &now, &key, &token, &acquired, &expires); err != nil {
			rows.close()
			return rep, p.wrap("renew lanes", err)
		}
		rep.Census.Lanes, rep.Census.Members = int(lanes), int(members)
		if rep.Census.Loads == nil {
			rep.Census.Loads = parseLoads(loads.String)
		}
		rep.ConfigVersion, rep.HasConfigVersion = uint64(version.Int64), version.Valid
		if key.Valid {
			rep.Held = append(rep.Held, Lane{Key: key.String, FencingToken: uint64(token.Int64), Instance: instance,
				AcquiredAt: time.UnixMilli(acquired.Int64), ExpiresAt: time.UnixMilli(expires.Int64),
				Remaining: time.Duration(expires.Int64-now) * time.Millisecond})
		}
	}
	if err := rows.close(); err != nil {
		return rep, p.wrap("renew lanes", err)
	}
	rep.Census.Mine = len(rep.Held)
	return rep, nil
}

// ReleaseLane implements [provider.LaneStore].
func (p *DBProvider) ReleaseLane(ctx context.Context, scope, key, holder, instance string) error {
	return p.exec(ctx, "release lane "+quote(key), p.q.LaneRelease, scope, key, holder, instance)
}

// parseLoads reads the loads column of lane_peek and lane_report:
// "2b,1a" is a member with 2 lanes that sorts before the instance and one
// with 1 that sorts after. An entry it cannot read is left out.
func parseLoads(s string) []provider.MemberLoad {
	if s == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	loads := make([]provider.MemberLoad, 0, len(parts))
	for _, p := range parts {
		if len(p) < 2 {
			continue
		}
		n, err := strconv.Atoi(p[:len(p)-1])
		if err != nil {
			continue
		}
		loads = append(loads, provider.MemberLoad{Lanes: n, Before: p[len(p)-1] == 'b'})
	}
	return loads
}

// InTx implements [provider.Transactor]: BEGIN (on SQLite BEGIN
// IMMEDIATE, which takes the write lock a claim needs at once, as
// _txlock=immediate does) on a connection of the pool, f, then COMMIT, or
// ROLLBACK when f or the COMMIT failed.
func (p *DBProvider) InTx(ctx context.Context, f func(tx provider.Querier) error) error {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	begin := "BEGIN"
	if p.d.name() == SQLite {
		begin = "BEGIN IMMEDIATE"
	}
	if _, err := conn.Exec(ctx, begin); err != nil {
		return p.wrap("begin a transaction", err)
	}
	background := context.WithoutCancel(ctx)
	if err := f(conn); err != nil {
		endTx(background, conn, false)
		return err
	}
	if err := endTx(background, conn, true); err != nil {
		endTx(background, conn, false)
		return p.wrap("commit", err)
	}
	return nil
}

// ReleaseLanes implements [provider.LaneStore].
func (p *DBProvider) ReleaseLanes(ctx context.Context, scope, holder, instance string) error {
	return p.exec(ctx, "release lanes", p.q.LaneReleaseAll, scope, holder, instance)
}

// ReadLane implements [provider.LaneStore].
func (p *DBProvider) ReadLane(ctx context.Context, scope, key string) (*Lane, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	var r laneRow
	err = r.scan(conn.QueryRow(ctx, p.q.LaneRead, scope, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, p.wrap("read lane "+quote(key), err)
	}
	l := r.lane(key)
	return &l, nil
}

// ListLanes reads every lane of scope (the lease name), held or not,
// sorted by key, for operators (clusterctl lanes). A lane is free when
// its Remaining is not positive.
func (p *DBProvider) ListLanes(ctx context.Context, scope string) ([]Lane, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := queryRows(ctx, conn, p.q.LaneList, scope)
	if err != nil {
		return nil, p.wrap("list lanes", err)
	}
	var out []Lane
	for rows.next() {
		var key string
		var r laneRow
		if err := rows.scan(&key, &r.holder, &r.instance, &r.token, &r.acquired, &r.renewed, &r.expires, &r.now); err != nil {
			rows.close()
			return nil, p.wrap("list lanes", err)
		}
		out = append(out, r.lane(key))
	}
	if err := rows.close(); err != nil {
		return nil, p.wrap("list lanes", err)
	}
	return out, nil
}

// ForceReleaseLane ends the claim on lane key of scope (the lease name)
// whose fencing token is token at once, by the database clock, whoever
// holds it, keeping the token, and reports whether it ended it. It ends
// that claim and no other, in one statement: when the lane is held under
// another token, it ends nothing and returns a [*LaneHeldError] naming the
// holder now; when the lane is free it returns false and no error. The
// next claim gets a higher token, and the holder's next ClaimLane of it
// starts a new claim (or is refused, if another node claimed it first);
// its OwnsLane turns false at its keeper's next heartbeat. A transaction holding the lane
// makes the release wait for it to end (PostgreSQL, MySQL). For operators
// (clusterctl release -lane).
func (p *DBProvider) ForceReleaseLane(ctx context.Context, scope, key string, token uint64) (bool, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return false, err
	}
	n, err := conn.Exec(ctx, p.d.bound(p.q.LaneExpire, statementLimit(ctx)), scope, key, int64(token))
	release()
	if err != nil {
		return false, p.wrap("release lane "+quote(key), err)
	}
	if n == 1 {
		return true, nil
	}
	l, err := p.ReadLane(ctx, scope, key)
	if err != nil || l == nil || l.Remaining <= 0 {
		return false, err
	}
	return false, &LaneHeldError{Lane: key, Holder: l.Holder, Instance: l.Instance, FencingToken: l.FencingToken,
		ExpiresAt: l.ExpiresAt, Remaining: l.Remaining}
}

// JoinLanes implements [provider.LaneStore].
func (p *DBProvider) JoinLanes(ctx context.Context, scope, instance string) error {
	return p.exec(ctx, "record that this node takes lanes", p.q.LaneJoin, scope, instance)
}

// ReadConfigVersion implements [provider.ConfigStore].
func (p *DBProvider) ReadConfigVersion(ctx context.Context, scope string) (uint64, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	var v int64
	err = conn.QueryRow(ctx, p.q.ConfigRead, scope).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err := conn.Exec(ctx, p.d.bound(p.q.ConfigCreate, statementLimit(ctx)), scope); err != nil {
			return 0, p.wrap("create the config version", err)
		}
		err = conn.QueryRow(ctx, p.q.ConfigRead, scope).Scan(&v)
	}
	if err != nil {
		return 0, p.wrap("read the config version", err)
	}
	return uint64(v), nil
}

// BumpConfigVersion implements [provider.ConfigStore].
func (p *DBProvider) BumpConfigVersion(ctx context.Context, scope string) (uint64, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	v, err := p.lanes().bumpConfig(ctx, conn, scope)
	if err != nil {
		return 0, p.wrap(fmt.Sprintf("bump the config version of %q", scope), err)
	}
	return uint64(v), nil
}

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
	LaneReport string `sql:"lane_report"` // scope, window ms, scope, instance, window ms, instance, scope, instance, window ms, scope, scope, instance
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
	return queryRows(ctx, conn, report, scope, w, scope, instance, w, instance, scope, instance, w, scope, scope, instance)
}
