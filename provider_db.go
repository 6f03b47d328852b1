package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// DBProvider is the default [provider.Provider]: one row per lease in the table
// <prefix>lease of a PostgreSQL, MySQL/MariaDB or SQLite database. It
// also implements every optional capability ([provider.Fencer], [provider.ChainStore],
// [provider.StateStore], [provider.InstanceReleaser], [provider.Initializer], [provider.SchemaChecker],
// [provider.MemberStore], [provider.LaneStore], [provider.Transactor], [provider.ConfigStore],
// [provider.ReleaseWatcher]), and a
// node reaches it only through those interfaces: a type that wraps a
// *DBProvider to add metrics or tracing keeps them all, whether it embeds
// it or delegates each method.
//
// [New] builds one over [Config.DB] when [Config.Provider] is nil. Build
// one yourself with [NewDBProvider] (database/sql), clusterpgx.NewProvider
// (pgx) or [NewSQLProvider] (any driver, through a [provider.Pool]), and call its
// Init or CheckSchema before any other method ([New] does): on PostgreSQL
// they resolve the schema of the cluster tables, which every statement
// then names, so that a temporary table of the same name on a session
// cannot stand in for one (before, statements name the tables as the
// search_path finds them).
type DBProvider struct {
	pool   provider.Pool
	d      dialect
	q      *queries
	prefix string
	log    *slog.Logger
	// laneRows holds lanes (scope and key) whose row this provider saw,
	// so that a claim of another lane creates its row first; see
	// ClaimLane. At most maxLaneRows: a service that keys lanes by order
	// id uses new keys without end.
	laneRows laneRowSet
	// warmPause is the unix time (ns) before which no warm-up is tried:
	// one that fails, by a timeout say, may cost its connection, and one
	// tried on every attempt would then cost one on every attempt.
	warmPause atomic.Int64
	// watchers are the nodes that watch releases through this provider
	// (wake.go).
	watchers watchers
	// fences are the fence's reads prepared on the pool's *sql.DB, by
	// TTL (nil values: not prepared, or not yet), until Close; see
	// preparedFor, whose goroutines preparing counts and prepCancel stops.
	fenceMu    sync.Mutex
	fences     map[time.Duration]*preparedFence
	closed     bool
	prepCtx    context.Context
	prepCancel context.CancelFunc
	preparing  sync.WaitGroup
}

const (
	// warmBudget is the least time an attempt's context must have left
	// for a warm-up to run on its connection.
	warmBudget = 50 * time.Millisecond
	// warmPauseAfterFailure is how long a failed warm-up stops others.
	warmPauseAfterFailure = time.Minute
)

var (
	_ provider.Provider         = (*DBProvider)(nil)
	_ provider.Initializer      = (*DBProvider)(nil)
	_ provider.InstanceReleaser = (*DBProvider)(nil)
	_ provider.Fencer           = (*DBProvider)(nil)
	_ provider.ChainStore       = (*DBProvider)(nil)
	_ provider.StateStore       = (*DBProvider)(nil)
	_ provider.SchemaChecker    = (*DBProvider)(nil)
	_ provider.MemberStore      = (*DBProvider)(nil)
	_ provider.ReleaseWatcher   = (*DBProvider)(nil)
)

// NewDBProvider returns the default [provider.Provider] over a database/sql pool:
// one row per lease in the table <tablePrefix>lease, created or upgraded
// by its Init method (which [New] calls). An empty dialect is detected
// from db's driver; an empty tablePrefix means "cluster_". Embed the
// result in a type of your own, or delegate to it, to wrap it (metrics,
// tracing): every capability stays.
func NewDBProvider(db *sql.DB, dialect Dialect, tablePrefix string) (*DBProvider, error) {
	if db == nil {
		return nil, configErrorf("NewDBProvider needs a *sql.DB, got nil")
	}
	cfg, err := Config{NodeID: "-", DB: db, Dialect: dialect, TablePrefix: tablePrefix}.resolve()
	if err != nil {
		return nil, err
	}
	return newDBProvider(cfg.DB, cfg.Dialect, cfg.TablePrefix, defaultLogger()), nil
}

// NewSQLProvider returns the default [provider.Provider] over a pool of any driver
// that speaks dialect; see [DBProvider]. An empty tablePrefix means
// "cluster_".
func NewSQLProvider(pool provider.Pool, dialect Dialect, tablePrefix string) (*DBProvider, error) {
	if pool == nil {
		return nil, configErrorf("NewSQLProvider needs a Pool")
	}
	cfg, err := Config{NodeID: "-", Provider: &nopProvider{}, TablePrefix: tablePrefix}.resolve()
	if err != nil {
		return nil, err
	}
	d, err := newDialect(dialect, cfg.TablePrefix)
	if err != nil {
		return nil, err
	}
	return &DBProvider{pool: pool, d: d, q: d.queries(), prefix: cfg.TablePrefix, log: defaultLogger()}, nil
}

func newDBProvider(db *sql.DB, d Dialect, prefix string, log *slog.Logger) *DBProvider {
	dl, err := newDialect(d, prefix)
	if err != nil {
		panic(err) // resolved by Config.resolve
	}
	return &DBProvider{pool: sqlPool{db}, d: dl, q: dl.queries(), prefix: prefix, log: log}
}

// Dialect returns the SQL dialect the provider speaks.
func (p *DBProvider) Dialect() Dialect { return p.d.name() }

// TablePrefix returns the prefix of the provider's tables.
func (p *DBProvider) TablePrefix() string { return p.prefix }

// nopProvider stands in for a provider while a Config is resolved only for
// its TablePrefix.
type nopProvider struct{ provider.Provider }

// conn takes a connection from the pool, retrying while the dialect calls
// the failure transient.
func (p *DBProvider) conn(ctx context.Context) (provider.Querier, func(), error) {
	conn, release, err := p.pool.Conn(ctx)
	for delay := 5 * time.Millisecond; err != nil && p.d.transient(err); delay = min(2*delay, 100*time.Millisecond) {
		select {
		case <-ctx.Done():
			return nil, nil, p.wrap("connect", err)
		case <-time.After(delay):
		}
		conn, release, err = p.pool.Conn(ctx)
	}
	if err != nil {
		if errors.Is(err, ErrPoolExhausted) {
			return nil, nil, err
		}
		return nil, nil, p.wrap("connect", err)
	}
	return conn, release, nil
}

// Acquire implements [provider.Provider].
func (p *DBProvider) Acquire(ctx context.Context, req provider.LeaseRequest) (provider.Lease, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return provider.Lease{}, err
	}
	defer release()
	if pl, ok := p.d.(poller); ok && req.Poll {
		// A routine poll: read first, and attempt only if the lease is
		// free, expired, or held by this very instance (an answer lost).
		r, err := pl.poll(ctx, conn, req)
		switch {
		case errors.Is(err, sql.ErrNoRows): // no lease row yet
		case err != nil:
			return provider.Lease{}, p.wrap("acquire lease "+quote(req.Name), err)
		case r.expiresAt > r.now && r.instance != req.Instance:
			return provider.Lease{}, r.held()
		}
	}
	for attempt := 0; ; attempt++ {
		granted, r, err := p.d.acquire(ctx, conn, req)
		if err != nil {
			return provider.Lease{}, p.wrap("acquire lease "+quote(req.Name), err)
		}
		if granted {
			return r.lease(req.Name), nil
		}
		// Refused, yet the row read back is free: another node won a race
		// and the statement saw the row from before its commit (PostgreSQL's
		// snapshot, MySQL's read after the UPDATE). Try again: the winner
		// has committed by now, so we learn who leads, or win.
		if r.expiresAt > r.now || attempt == 2 {
			if w, ok := p.d.(warmer); ok && r.cold && p.mayWarm(ctx) {
				if err := w.warm(ctx, conn); err != nil {
					p.warmPause.Store(time.Now().Add(warmPauseAfterFailure).UnixNano())
					p.log.DebugContext(ctx, "cluster: warming the database session for its first grant failed; it grants all the same, a little slower; no warm-up for a while",
						"pause", warmPauseAfterFailure, "err", err)
				}
			}
			return provider.Lease{}, r.held()
		}
	}
}

// mayWarm reports whether a warm-up may run now on an attempt's connection
// whose context is ctx: not within warmPauseAfterFailure of a failed one,
// and only with warmBudget left, so that it does not run the attempt's
// context out and cost the connection.
func (p *DBProvider) mayWarm(ctx context.Context) bool {
	if time.Now().UnixNano() < p.warmPause.Load() {
		return false
	}
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) >= warmBudget
}

// Renew implements [provider.Provider].
func (p *DBProvider) Renew(ctx context.Context, l provider.Lease, ttl time.Duration) (provider.Lease, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return l, err
	}
	defer release()
	expires, err := p.d.renew(ctx, conn, l, ttl)
	if errors.Is(err, sql.ErrNoRows) {
		return l, fmt.Errorf("%w: lease %q is no longer held by node %q with fencing token %d", ErrLeaseLost, l.Name, l.Holder, l.FencingToken)
	}
	if err != nil {
		return l, p.wrap("renew lease "+quote(l.Name), err)
	}
	l.ExpiresAt = time.UnixMilli(expires)
	return l, nil
}

// Release implements [provider.Provider]: it ends term l if it still holds and
// wakes the nodes that watch the lease: through this provider at once and,
// on PostgreSQL, in other processes by the NOTIFY of the release
// statement, which commits with it.
func (p *DBProvider) Release(ctx context.Context, l provider.Lease) error {
	_, err := p.release(ctx, l.Name, l.Instance, p.q.Release, l.Name, l.Holder, l.Instance, int64(l.FencingToken))
	return err
}

// ReleaseInstance implements [provider.InstanceReleaser].
func (p *DBProvider) ReleaseInstance(ctx context.Context, name, holder, instance string) error {
	_, err := p.release(ctx, name, instance, p.q.ReleaseInstance, name, holder, instance)
	return err
}

// release runs release statement q on the lease named name, held by
// instance ("" when not known), and reports whether it ended a term; if
// it did, it wakes the other watchers of the lease through p.
func (p *DBProvider) release(ctx context.Context, name, instance, q string, args ...any) (bool, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	n, err := conn.Exec(ctx, p.d.bound(q, statementLimit(ctx)), args...)
	if err != nil {
		return false, p.wrap("release lease "+quote(name), err)
	}
	if n == 0 {
		return false, nil
	}
	p.watchers.wake(name, instance)
	return true, nil
}

// exec runs a lease statement, bounded on the server, on a connection of
// its own.
func (p *DBProvider) exec(ctx context.Context, op, q string, args ...any) error {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	if _, err := conn.Exec(ctx, p.d.bound(q, statementLimit(ctx)), args...); err != nil {
		return p.wrap(op, err)
	}
	return nil
}

// Leader implements [provider.Provider].
func (p *DBProvider) Leader(ctx context.Context, name string) (*Leader, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	var r row
	err = r.scan(conn.QueryRow(ctx, p.q.Leader, name))
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

// LeaseToken implements [provider.ChainStore].
func (p *DBProvider) LeaseToken(ctx context.Context, name string) (uint64, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	var token int64
	err = conn.QueryRow(ctx, p.q.LeaseToken, name).Scan(&token)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, p.wrap("read lease "+quote(name), err)
	}
	return uint64(token), nil
}

// Fence implements [provider.Fencer]: it reads the lease row in tx, locking it for
// share (FOR SHARE on PostgreSQL, LOCK IN SHARE MODE on MySQL; SQLite's
// transactions are serializable), and bounds on the server the wait for
// that lock and how long tx may then idle (PostgreSQL for the rest of the
// transaction; MariaDB through the session's idle_transaction_timeout,
// which stays set on the connection; MySQL 8 cannot).
func (p *DBProvider) Fence(ctx context.Context, tx provider.Querier, l provider.Lease, ttl time.Duration) error {
	if err := checkQuerier("Fence", tx); err != nil {
		return err
	}
	if q, ok := tx.(sqlQuerier); ok {
		if t, ok := q.h.(*sql.Tx); ok {
			if f := p.preparedFor(ttl); f != nil {
				tx = preparedQuerier{q, t, f}
			}
		}
	}
	r, err := p.d.fence(ctx, tx, l.Name, ttl, fenceLimit(ctx, ttl))
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

// WriteTip implements [provider.ChainStore].
func (p *DBProvider) WriteTip(ctx context.Context, tx provider.Querier, t provider.ChainTip) error {
	if err := checkQuerier("AdvanceTip", tx); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, p.q.TipWrite, t.Chain, t.Lease, int64(t.Counter), t.Hash, int64(t.FencingToken))
	if err != nil {
		return p.wrap(fmt.Sprintf("advance tip of chain %q to %d under fencing token %d", t.Chain, t.Counter, t.FencingToken), err)
	}
	return nil
}

// ReadTip implements [provider.ChainStore].
func (p *DBProvider) ReadTip(ctx context.Context, tx provider.Querier, chain string) (provider.ChainTip, bool, error) {
	if isNil, given := nilQuerier(tx); isNil && tx != nil {
		return provider.ChainTip{}, false, errNilTx("AdvanceTip", given)
	}
	if tx == nil {
		conn, release, err := p.conn(ctx)
		if err != nil {
			return provider.ChainTip{}, false, err
		}
		defer release()
		tx = conn
	}
	t := provider.ChainTip{Chain: chain}
	var counter, token int64
	err := tx.QueryRow(ctx, p.q.TipRead, chain).Scan(&counter, &t.Hash, &token, &t.Lease)
	if errors.Is(err, sql.ErrNoRows) {
		return t, false, nil
	}
	if err != nil {
		return t, false, p.wrap(fmt.Sprintf("read tip of chain %q", chain), err)
	}
	t.Counter, t.FencingToken = uint64(counter), uint64(token)
	return t, true, nil
}

// HighWater implements [provider.ChainStore].
func (p *DBProvider) HighWater(ctx context.Context, scope string) (uint64, bool, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return 0, false, err
	}
	defer release()
	var v int64
	err = conn.QueryRow(ctx, p.q.MarkRead, scope).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, p.wrap(fmt.Sprintf("read the high-water mark of %q", scope), err)
	}
	return uint64(v), true, nil
}

// ChainRows implements [provider.ChainStore].
func (p *DBProvider) ChainRows(ctx context.Context, ch Chain, at uint64) (provider.ChainRows, error) {
	var rows provider.ChainRows
	conn, release, err := p.conn(ctx)
	if err != nil {
		return rows, err
	}
	defer release()
	var top sql.NullInt64
	if err := conn.QueryRow(ctx, chainQuery(p.q.ChainTop, ch)).Scan(&top); err != nil {
		return rows, p.wrap(fmt.Sprintf("read the last counter of chain %q (table %s)", ch.Name, ch.Table), err)
	}
	rows.Top, rows.HasTop = uint64(top.Int64), top.Valid
	err = conn.QueryRow(ctx, chainQuery(p.q.ChainHashAt, ch), int64(at)).Scan(&rows.Hash)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return rows, p.wrap(fmt.Sprintf("read the row of chain %q (table %s) at counter %d", ch.Name, ch.Table, at), err)
	default:
		rows.Found = true
	}
	return rows, nil
}

// ReadVaultState implements [provider.StateStore].
func (p *DBProvider) ReadVaultState(ctx context.Context, scope string) (provider.VaultState, bool, error) {
	var s provider.VaultState
	conn, release, err := p.conn(ctx)
	if err != nil {
		return s, false, err
	}
	defer release()
	var epoch, at int64
	err = conn.QueryRow(ctx, p.q.StateRead, scope).Scan(&s.Fingerprint, &epoch, &at, &s.RecordedBy)
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, p.wrap("read vault key fingerprint", err)
	}
	s.RotationEpoch, s.RecordedAt = uint64(epoch), time.UnixMilli(at)
	return s, true, nil
}

// InsertVaultState implements [provider.StateStore].
func (p *DBProvider) InsertVaultState(ctx context.Context, scope, fingerprint, node string) error {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	if _, err := conn.Exec(ctx, p.q.StateInsert, scope, fingerprint, node); err != nil {
		return p.wrap("record vault key fingerprint", err)
	}
	return nil
}

// RotateVaultState implements [provider.StateStore].
func (p *DBProvider) RotateVaultState(ctx context.Context, scope, from, to, node string) (bool, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	n, err := conn.Exec(ctx, p.q.StateRotate, to, node, scope, from)
	if err != nil {
		return false, p.wrap("rotate vault key fingerprint", err)
	}
	return n == 1, nil
}

// leftRetention is how long the row of a member that left is kept: then
// the next node to join takes it over (node_recycle).
const leftRetention = time.Hour

// crashedRetention is how long the row of a member still marked active is
// kept after it was last seen (its process died without Shutdown): then
// the next node to join takes it over. A process that resumes after a
// pause this long may find its row gone; where Seen runs (every node on
// MySQL and SQLite, followers on PostgreSQL) it reports that and the node
// joins again.
const crashedRetention = 7 * 24 * time.Hour

// Join implements [provider.MemberStore]. The new member takes over the row of a
// member of scope that left more than leftRetention ago, or was last seen
// more than crashedRetention ago, if there is one, and adds a row
// otherwise, so restarts do not grow the table.
func (p *DBProvider) Join(ctx context.Context, scope string, m Member) error {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	n, err := conn.Exec(ctx, p.d.bound(p.q.NodeRecycle, statementLimit(ctx)),
		m.Instance, m.NodeID, m.Host, int64(m.PID), m.Endpoint, m.Timeout.Milliseconds(), scope, leftRetention.Milliseconds(), crashedRetention.Milliseconds())
	if err == nil && n == 1 {
		return nil
	}
	if err != nil {
		if werr := p.wrap("join the cluster", err); errors.Is(werr, ErrReadOnly) || ctx.Err() != nil {
			return werr // node_join would fail the same way
		}
		// The join goes on: a row of this instance already there (a
		// second Join, after one whose answer was lost) is a key
		// conflict, which node_join updates.
	}
	if _, jerr := conn.Exec(ctx, p.d.bound(p.q.NodeJoin, statementLimit(ctx)), scope, m.Instance, m.NodeID, m.Host, int64(m.PID), m.Endpoint, m.Timeout.Milliseconds()); jerr != nil {
		if err != nil {
			jerr = errors.Join(jerr, err)
		}
		return p.wrap("join the cluster", jerr)
	}
	if err != nil {
		p.log.DebugContext(ctx, "cluster: taking over the membership row of a member that left failed; added a row", "err", err)
	}
	return nil
}

// Seen implements [provider.MemberStore]. When instance has no row in scope (a
// node joining took it over after it went unseen for crashedRetention) it
// returns an error, and the node joins again.
func (p *DBProvider) Seen(ctx context.Context, scope, instance string) error {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	n, err := conn.Exec(ctx, p.d.bound(p.q.NodeSeen, statementLimit(ctx)), scope, instance)
	if err != nil {
		return p.wrap("refresh membership", err)
	}
	if n == 0 {
		// MySQL counts the rows an UPDATE changed: one in the same
		// millisecond as the last (the heartbeat's and the lanes keeper's)
		// changes none. Ask whether the row is there.
		var one int
		err := conn.QueryRow(ctx, p.d.bound(p.q.NodeRow, statementLimit(ctx)), scope, instance).Scan(&one)
		if err == nil {
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return p.wrap("refresh membership", err)
		}
		return fmt.Errorf("cluster: refresh membership: instance %s has no row under lease name %q (a node that joined took it over after it went unseen for %v): %w",
			instance, scope, crashedRetention, provider.ErrNotMember)
	}
	return nil
}

// Leave implements [provider.MemberStore].
func (p *DBProvider) Leave(ctx context.Context, scope, instance string) error {
	return p.exec(ctx, "leave the cluster", p.q.NodeLeave, scope, instance)
}

// Forget deletes the membership rows of node nodeID in scope (the lease
// name) that are not live: left, or not seen within timeout by the
// database clock, as [Cluster.Members] judges them. It returns how many it
// deleted. It refuses, with an error wrapping [ErrMemberLive], a node with
// a live row, and never deletes one, even one that comes to life while it
// runs. A forgotten process that is in fact alive (paused for longer than
// timeout) joins again at its next membership refresh. It backs
// clusterctl's forget command.
func (p *DBProvider) Forget(ctx context.Context, scope, nodeID string, timeout time.Duration) (int64, error) {
	if timeout <= 0 {
		return 0, configErrorf("Forget needs a positive timeout, not %v", timeout)
	}
	conn, release, err := p.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	ms := timeout.Milliseconds()
	var live int64
	if err := conn.QueryRow(ctx, p.d.bound(p.q.NodeLive, statementLimit(ctx)), scope, nodeID, ms).Scan(&live); err != nil {
		return 0, p.wrap(fmt.Sprintf("read the membership of node %q", nodeID), err)
	}
	if live > 0 {
		return 0, fmt.Errorf("%w: node %q of lease %q has %d process(es) seen within their node timeout (LeaseTTL and three heartbeats; %v for a row that recorded none): stop it first, or wait until it goes unseen", ErrMemberLive, nodeID, scope, live, timeout)
	}
	n, err := conn.Exec(ctx, p.d.bound(p.q.NodeForget, statementLimit(ctx)), scope, nodeID, ms)
	if err != nil {
		return 0, p.wrap(fmt.Sprintf("forget node %q", nodeID), err)
	}
	return n, nil
}

// SeenByLease implements [provider.MemberStore]: on PostgreSQL the lease statements
// refresh membership too.
func (p *DBProvider) SeenByLease() bool { return p.d.seenByLease() }

// Members implements [provider.MemberStore].
func (p *DBProvider) Members(ctx context.Context, scope string, fallback time.Duration) ([]Member, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := queryRows(ctx, conn, p.q.Members, scope)
	if err != nil {
		return nil, p.wrap("read members", err)
	}
	var out []Member
	for rows.next() {
		var m Member
		var pid, started, seen, timeout, leads, now int64
		if err := rows.scan(&m.NodeID, &m.Instance, &m.Host, &pid, &m.Endpoint, &started, &seen, &m.Status, &timeout, &leads, &now); err != nil {
			rows.close()
			return nil, p.wrap("read members", err)
		}
		m.PID, m.Leader = int(pid), leads == 1
		m.StartedAt, m.LastSeen = time.UnixMilli(started), time.UnixMilli(seen)
		m.SeenAgo = time.Duration(max(now-seen, 0)) * time.Millisecond
		m.Timeout = time.Duration(timeout) * time.Millisecond
		judge := m.Timeout
		if judge <= 0 {
			judge = fallback // a row written before members recorded theirs
		}
		m.Live = m.Status == "active" && m.SeenAgo < judge
		out = append(out, m)
	}
	if err := rows.close(); err != nil {
		return nil, p.wrap("read members", err)
	}
	return out, nil
}

// Tips lists every recorded chain tip, for operators (clusterctl tips).
func (p *DBProvider) Tips(ctx context.Context) ([]provider.ChainTip, error) {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := queryRows(ctx, conn, p.q.TipsList)
	if err != nil {
		return nil, p.wrap("list chain tips", err)
	}
	var out []provider.ChainTip
	for rows.next() {
		var t provider.ChainTip
		var counter, token, updated int64
		if err := rows.scan(&t.Chain, &t.Lease, &counter, &t.Hash, &token, &updated); err != nil {
			rows.close()
			return nil, p.wrap("list chain tips", err)
		}
		t.Counter, t.FencingToken = uint64(counter), uint64(token)
		out = append(out, t)
	}
	if err := rows.close(); err != nil {
		return nil, p.wrap("list chain tips", err)
	}
	return out, nil
}

// ForceRelease ends the term of the lease named name whose fencing token
// is token at once, by the database clock, keeping the token, and reports
// whether it ended it. It ends that term and no other, in one statement:
// when the lease is held under another token (it changed hands since the
// caller read it), it ends nothing and returns a [*LeaseHeldError] naming
// the holder now; when no term is held it returns false and no error. The
// holder of the ended term stops believing it leads when its trust window
// closes (its next renew fails), and the database refuses its fenced
// writes at once. For operators (clusterctl release -force).
func (p *DBProvider) ForceRelease(ctx context.Context, name string, token uint64) (bool, error) {
	ended, err := p.forceRelease(ctx, name, token)
	if err != nil || ended {
		return ended, err
	}
	return false, p.heldOther(ctx, name)
}

func (p *DBProvider) forceRelease(ctx context.Context, name string, token uint64) (bool, error) {
	return p.release(ctx, name, "", p.q.LeaseExpire, name, int64(token))
}

// heldOther returns a *LeaseHeldError when lease name is held, nil when
// it is free: what an operator's release of a term it did not find says.
func (p *DBProvider) heldOther(ctx context.Context, name string) error {
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	var r row
	if err := r.scan(conn.QueryRow(ctx, p.q.Leader, name)); errors.Is(err, sql.ErrNoRows) {
		return nil
	} else if err != nil {
		return p.wrap("read lease "+quote(name), err)
	}
	if r.expiresAt <= r.now || r.holder == "" {
		return nil
	}
	return r.held()
}

// Retire retires the lease name: its row stays, with its fencing token
// (the guards refuse deleting it, rightly: a name used again continues
// from that token), but names no holder, and its members are marked left.
// The lease must not be held: release it first (ForceRelease), or stop
// its nodes. For operators (clusterctl retire).
func (p *DBProvider) Retire(ctx context.Context, name string) error {
	l, err := p.Leader(ctx, name)
	if err != nil {
		return err
	}
	if l != nil {
		return fmt.Errorf("%w: lease %q is held by node %q (fencing token %d); stop its nodes or release it first",
			ErrLeaseHeld, name, l.NodeID, l.FencingToken)
	}
	if err := p.exec(ctx, "retire lease "+quote(name), p.q.LeaseRetire, name); err != nil {
		return err
	}
	return p.exec(ctx, "retire the members of lease "+quote(name), p.q.NodesRetire, name)
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
	"SF007": {ErrRollbackDetected, "the lease or lane row is below the highest fencing token the database ever granted it: it was truncated or restored on its own; " +
		"an operator must restore the token (see docs/guarantees.md) before it is granted again"},
	"SF008": {ErrLaneDeleted, "the database refused to delete, truncate or rename a lane row"},
	"SF009": {ErrTokenLowered, "the database refused to hand a lease or lane to another holder under the same fencing token: a new holder needs a new token"},
}

// wrap turns a driver error into one that says what went wrong, wrapping
// one of our sentinels where one applies; the dialect reads the driver's
// codes.
func (p *DBProvider) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	kind, hint, guard := p.d.classify(err)
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
