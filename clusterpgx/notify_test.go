package clusterpgx_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// longPoll gives followers a poll so slow that a takeover within a fraction
// of it can only come from a notification.
func longPoll(c *cluster.Config) {
	c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 6*time.Second, 2*time.Second, 4*time.Second
}

// expireQuietly ends the current term in the database without telling
// anyone: no NOTIFY, no in-process wake-up.
func expireQuietly(t *testing.T, pool *pgxpool.Pool, tg testdb.Target) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "UPDATE "+tg.Prefix+"lease SET expires_at = 0"); err != nil {
		t.Fatal(err)
	}
}

// A follower that LISTENs takes over as soon as a release is notified,
// long before its next poll; when its listening connection is killed it
// polls every heartbeat again, and listens again once it can.
func TestNotifyHandoffAndPollingFallback(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	admin := newPool(t, tg, 0)
	attempts := make(chan time.Time, 64) // a's refused acquisitions
	// The statements of a's and b's pools, to find the listening
	// connections: each node LISTENs on a connection of its pool.
	sent := &connLog{}
	a := node(t, tg, tracedPool(t, tg, sent), "a", func(c *cluster.Config) {
		longPoll(c)
		c.Observer = func(o cluster.Operation) {
			if o.Kind == cluster.OpAcquire && o.Outcome == cluster.OutcomeHeld {
				select {
				case attempts <- time.Now():
				default:
				}
			}
		}
	})
	b := node(t, tg, tracedPool(t, tg, sent), "b", longPoll)
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	waitFor(t, 3*time.Second, "b to hear releases", func() bool { return b.Stats().HearingReleases })
	// b has just learnt that a leads: its next poll is a TTL away.
	time.Sleep(100 * time.Millisecond) // let b's first attempt, made at start, land
	expireQuietly(t, admin, tg)
	if _, err := admin.Exec(ctx, "SELECT pg_notify($1, 'leader')", tg.Prefix+"lease"); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, time.Second, "b to take over on the notification", b.IsLeader)
	t.Logf("b led %v after the notification (its poll: up to %v)", took.Round(time.Millisecond), 6*time.Second)

	waitFor(t, 5*time.Second, "a to learn it lost the lease", func() bool { return !a.IsLeader() })

	// Keep killing the listening connections: a, now a follower, polls
	// every heartbeat while it cannot listen.
	killCtx, stopKilling := context.WithCancel(ctx)
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for killCtx.Err() == nil {
			admin.Exec(killCtx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY($1)", sent.listenerPIDs())
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() { stopKilling(); <-killed }()
	waitFor(t, 2*time.Second, "a to stop hearing", func() bool { return !a.Stats().HearingReleases && !b.Stats().HearingReleases })
	time.Sleep(500 * time.Millisecond) // past the attempt made when it stopped hearing
	for len(attempts) > 0 {
		<-attempts
	}
	next := func() time.Time {
		select {
		case at := <-attempts:
			return at
		case <-time.After(4 * time.Second):
			t.Fatal("a made no attempt within 4s: it is not polling every heartbeat")
		}
		return time.Time{}
	}
	first := next()
	gap := next().Sub(first)
	t.Logf("a tries every %v without a listener (heartbeat 2s, TTL 6s)", gap.Round(time.Millisecond))
	if gap > 2500*time.Millisecond {
		t.Fatalf("a tries every %v without a listener, want at least once a heartbeat (2s)", gap)
	}
	stopKilling()
	<-killed
	waitFor(t, 5*time.Second, "the listener to come back", func() bool { return a.Stats().HearingReleases && b.Stats().HearingReleases })
}

// waitUntil polls cond until it holds or timeout passes, and reports
// whether it held.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	for start := time.Now(); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Since(start) > timeout {
			return false
		}
	}
	return true
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

// countingTracer counts the statements a pool sends.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countingPool is newPool with every statement counted by n.
func countingPool(t *testing.T, tg testdb.Target, n *countingTracer) *pgxpool.Pool {
	return tracedPool(t, tg, n)
}

// tracedPool is newPool with tracer on every connection.
func tracedPool(t *testing.T, tg testdb.Target, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(tg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// listenToReleases opens a connection of its own that LISTENs on the
// channel the release statements of tg's tables NOTIFY, closed when the
// test ends.
func listenToReleases(t *testing.T, tg testdb.Target) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, tg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close(ctx) })
	if _, err := listener.Exec(ctx, `LISTEN "`+tg.Prefix+`lease"`); err != nil {
		t.Fatal(err)
	}
	return listener
}

// The steady-state load with NOTIFY: the leader renews once per
// heartbeat, and a follower that hears releases makes about one statement
// per LeaseTTL (when the lease is due to expire), where one that polls
// makes one per heartbeat. BENCHMARKS.md quotes the figures this logs:
//
//	go test -run TestListeningFollowersStatements -v ./clusterpgx
func TestListeningFollowersStatements(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	var leaderN, hearingN, pollingN countingTracer
	a := node(t, tg, countingPool(t, tg, &leaderN), "a", nil)
	b := node(t, tg, countingPool(t, tg, &hearingN), "b", nil)
	c := node(t, tg, countingPool(t, tg, &pollingN), "c", func(c *cluster.Config) { c.PollOnly = true })
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	waitFor(t, 3*time.Second, "b to hear releases", func() bool { return b.Stats().HearingReleases })
	if c.Stats().HearingReleases {
		t.Fatal("c hears releases with PollOnly set")
	}
	time.Sleep(1100 * time.Millisecond) // past one TTL, so b's sleep until the expiry has begun
	l0, h0, p0 := leaderN.n.Load(), hearingN.n.Load(), pollingN.n.Load()
	const ttls = 4 // LeaseTTL 1s, heartbeat 100ms: 40 heartbeats
	time.Sleep(ttls * time.Second)
	leader, hearing, polling := leaderN.n.Load()-l0, hearingN.n.Load()-h0, pollingN.n.Load()-p0
	t.Logf("over %d TTLs (%d heartbeats): leader %d statements, listening follower %d, polling follower %d", ttls, ttls*10, leader, hearing, polling)
	if !a.IsLeader() {
		t.Skip("a lost the lease during the count (a stalled machine): the counts mean nothing")
	}
	// Generous bounds for a loaded machine: one per TTL, plus one.
	if hearing > ttls+2 {
		t.Errorf("the listening follower made %d statements in %d TTLs; want about one per TTL", hearing, ttls)
	}
	if polling < 3*ttls {
		t.Errorf("the polling follower made only %d statements in %d heartbeats: is the count working?", polling, ttls*10)
	}
}

// A follower tries once more as soon as it listens: the listener took a
// connection from its pool, likely the one its first attempt warmed up, and
// this attempt opens and warms the one the next handoff runs on.
func TestFollowerTriesOnceListening(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	pool := newPool(t, tg, 0)
	node(t, tg, newPool(t, tg, 0), "a", longPoll)
	var attempts atomic.Int64
	b := node(t, tg, pool, "b", func(c *cluster.Config) {
		longPoll(c)
		c.Observer = func(o cluster.Operation) {
			if o.Kind == cluster.OpAcquire && o.Outcome == cluster.OutcomeHeld {
				attempts.Add(1)
			}
		}
	})
	waitFor(t, 3*time.Second, "b to hear releases", func() bool { return b.Stats().HearingReleases })
	waitFor(t, 2*time.Second, "b's attempt once it listens, within half a heartbeat (its poll is a TTL, 6s, away)", func() bool { return attempts.Load() >= 2 })
	if st := pool.Stat(); st.IdleConns() == 0 {
		t.Errorf("b's pool has no idle connection beside the listener's: %d in all, %d acquired", st.TotalConns(), st.AcquiredConns())
	}
}

// connLog records which connection ran each statement.
type connLog struct {
	mu    sync.Mutex
	stmts []connStmt
}

type connStmt struct {
	conn *pgx.Conn
	sql  string
	args []any
}

func (l *connLog) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stmts = append(l.stmts, connStmt{conn, d.SQL, d.Args})
	return ctx
}

func (l *connLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// listenerPIDs are the server processes of the connections that ran a
// LISTEN.
func (l *connLog) listenerPIDs() []int64 {
	var pids []int64
	for _, s := range l.all() {
		if strings.HasPrefix(s.sql, "LISTEN ") {
			pids = append(pids, int64(s.conn.PgConn().PID()))
		}
	}
	return pids
}

func (l *connLog) all() []connStmt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]connStmt(nil), l.stmts...)
}
