package cluster_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// isWarmUp reports whether query is the warm-up statement (the warm query
// of schema/postgres_queries.sql).
func isWarmUp(query string) bool { return strings.HasPrefix(strings.TrimSpace(query), "DO $warm$") }

// On PostgreSQL a follower whose acquisition is refused warms its database
// session for the session's first grant (the warm query in
// schema/postgres_queries.sql): once per session, and without a trace: no
// scratch lease row or high-water mark is left, and the real lease's
// fencing tokens go on from where they were.
func TestFollowerWarmsItsSessionOnce(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	a := start(t, tg, "a")
	waitFor(t, 5*time.Second, "a to lead", a.IsLeader)

	var warmUps atomic.Int64
	db := openCountingOnly(t, tg, &warmUps, isWarmUp)
	db.SetMaxOpenConns(1) // one database session: every attempt of b runs on it
	b := startOn(t, tg, db, "b")
	// b polls once per heartbeat; a few refused attempts.
	waitFor(t, 5*time.Second, "b to make refused attempts", func() bool { return b.Stats().Acquisitions == 0 && warmUps.Load() > 0 })
	time.Sleep(5 * testdb.Heartbeat) // more refused attempts on the warmed session
	if n := warmUps.Load(); n != 1 {
		t.Fatalf("b warmed its one session %d times; want once", n)
	}
	ctx := context.Background()
	var mark string
	if err := db.QueryRowContext(ctx, "SELECT current_setting('sqlfence.' || $1 || 'warm', true)", tg.Prefix).Scan(&mark); err != nil || mark != "1" {
		t.Fatalf("b's session is not marked warm: %q, %v", mark, err)
	}

	admin := tg.Open(t)
	var leases, marks int
	if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM "+tg.Prefix+"lease").Scan(&leases); err != nil {
		t.Fatal(err)
	}
	if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM "+tg.Prefix+"high_water WHERE scope LIKE 'lease/%'").Scan(&marks); err != nil {
		t.Fatal(err)
	}
	if leases != 1 || marks != 1 {
		t.Fatalf("after the warm-up: %d lease rows and %d lease marks; want 1 and 1 (the warm-up must leave nothing)", leases, marks)
	}

	token := a.FencingToken()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b to lead", b.IsLeader)
	if got := b.FencingToken(); got != token+1 {
		t.Fatalf("b's fencing token = %d after a's %d; want %d", got, token, token+1)
	}
	if n := warmUps.Load(); n != 1 {
		t.Fatalf("%d warm-ups after b's grant; want still 1", n)
	}
}

// failingWarmPool is a database/sql pool whose connections fail the
// warm-up statement, as one that times out does, and count its tries.
type failingWarmPool struct {
	provider.Pool
	tries *atomic.Int64
}

func (p failingWarmPool) Conn(ctx context.Context) (provider.Querier, func(), error) {
	q, release, err := p.Pool.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return failingWarmConn{q, p.tries}, release, nil
}

type failingWarmConn struct {
	provider.Querier
	tries *atomic.Int64
}

func (c failingWarmConn) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	if isWarmUp(query) {
		c.tries.Add(1)
		return 0, context.DeadlineExceeded
	}
	return c.Querier.Exec(ctx, query, args...)
}

// A warm-up that fails (a timeout that may cost the connection, say) is
// not tried again on every refused attempt: the follower goes on without
// it, and takes over all the same.
func TestFailedWarmUpPauses(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	a := start(t, tg, "a")
	waitFor(t, 5*time.Second, "a to lead", a.IsLeader)

	var tries atomic.Int64
	p, err := cluster.NewSQLProvider(failingWarmPool{cluster.SQLPool(tg.Open(t)), &tries}, cluster.Postgres, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	b := start(t, tg, "b", func(c *cluster.Config) { c.Provider, c.DB = p, nil })
	waitFor(t, 5*time.Second, "b to try a warm-up", func() bool { return tries.Load() > 0 })
	time.Sleep(10 * testdb.Heartbeat) // ten more refused attempts
	if n := tries.Load(); n != 1 {
		t.Fatalf("b tried %d warm-ups in ten heartbeats after one failed; want 1", n)
	}
	if err := a.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b to lead", b.IsLeader)
}

// On PostgreSQL the statement a handoff waits for, the follower's grant,
// is a function of the schema that plans its statements once per database
// session: a statement sent with parameters is planned again at each of
// its first five runs in a session, which for this one costs ten times
// running it, and a follower runs it rarely. The function also keeps the
// guards' search_path (the schema, then pg_temp), so a session's
// temporary table cannot stand in for the lease table.
func TestLeaseFunctionsPlanOncePerSession(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	a := start(t, tg, "a")
	waitFor(t, 5*time.Second, "a to lead", a.IsLeader)
	db := tg.Open(t)
	ctx := context.Background()
	var schema string
	if err := db.QueryRowContext(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{"acquire"} {
		var config []string
		rows, err := db.QueryContext(ctx, "SELECT unnest(proconfig) FROM pg_proc WHERE proname = $1 AND pronamespace = current_schema()::regnamespace", tg.Prefix+fn)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			config = append(config, s)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		got := strings.Join(config, "; ")
		for _, want := range []string{"plan_cache_mode=force_generic_plan", "search_path=" + schema + ", pg_temp"} {
			if !strings.Contains(got, want) {
				t.Errorf("function %s%s is set %q; want %q among its settings", tg.Prefix, fn, got, want)
			}
		}
	}

	// A temporary table named like the lease table, in the session that
	// runs the acquisition, does not hide the real one from it: the
	// attempt is refused, naming a's term.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "CREATE TEMPORARY TABLE "+tg.Prefix+"lease (LIKE "+schema+"."+tg.Prefix+"lease)"); err != nil {
		t.Fatal(err)
	}
	var held string
	if err := db.QueryRowContext(ctx, "SELECT instance FROM "+tg.Prefix+"lease").Scan(&held); err != nil {
		t.Fatal(err)
	}
	var granted bool
	var instance string
	if err := conn.QueryRowContext(ctx, "SELECT granted, instance FROM "+tg.Prefix+"acquire($1, $2, $3, $4, $5)",
		"b", "b-instance", int64(60000), "", "leader").Scan(&granted, &instance); err != nil {
		t.Fatalf("an acquisition through a session with a temporary lease table: %v", err)
	}
	if granted || instance != held {
		t.Fatalf("an acquisition through a session with a temporary lease table: granted %v, holder instance %q; want refused, naming a's %q", granted, instance, held)
	}
}

// A database whose lease functions are missing (DDL applied in part, or
// dropped) is a schema error that says what to run, not a bare "function
// does not exist".
func TestMissingLeaseFunctionIsSchemaError(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	a := start(t, tg, "a")
	waitFor(t, 5*time.Second, "a to lead", a.IsLeader)
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	db := tg.Open(t)
	if _, err := db.ExecContext(ctx, "DROP FUNCTION "+tg.Prefix+"acquire"); err != nil {
		t.Fatal(err)
	}
	p, err := cluster.NewDBProvider(db, cluster.Postgres, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Acquire(ctx, provider.LeaseRequest{Name: "leader", Holder: "b", Instance: "b-instance", TTL: time.Minute})
	if !errors.Is(err, cluster.ErrSchema) || !strings.Contains(err.Error(), "clusterctl migrate") {
		t.Fatalf("an acquisition without the acquire function = %v; want ErrSchema saying to run clusterctl migrate", err)
	}
}

// A follower pinned to a read-only replica starts when the tables exist:
// New runs no DDL on a current schema, and the follower's one write, its
// membership, is refused once at Init and not tried again.
func TestFollowerStartsOnReadOnlyReplica(t *testing.T) {
	t.Parallel()
	fp := strings.Repeat("5a", cluster.VaultKeyFingerprintLen/2)
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		withKeys := func(c *cluster.Config) { c.VaultKeyFingerprint = fp }
		a := start(t, tg, "a", withKeys)
		ro := tg.OpenDSN(t, tg.ReadOnlyDSN(t))
		if _, err := ro.ExecContext(ctx, "CREATE TABLE "+tg.Prefix+"probe (x INTEGER)"); err == nil {
			t.Fatal("the read-only connection accepted DDL; the test would prove nothing")
		}
		p, err := cluster.NewDBProvider(ro, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		joins := &countedJoins{DBProvider: p}
		f := startOn(t, tg, ro, "f", withKeys, func(c *cluster.Config) { c.Role, c.Provider = cluster.RoleFollower, joins })
		l, err := f.CurrentLeader(ctx)
		if err != nil || l == nil || l.NodeID != "a" || l.FencingToken != a.FencingToken() {
			t.Fatalf("follower on the replica reads leader %+v, %v; want a with token %d", l, err, a.FencingToken())
		}
		// Its join at Init was refused as read-only, which no later join
		// changes: it does not try again at every poll.
		time.Sleep(10 * testdb.Heartbeat)
		if n := joins.n.Load(); n != 1 {
			t.Errorf("the follower on the replica tried to join %d times in ten heartbeats; want 1 (at Init)", n)
		}
	})
}

// countedJoins counts the membership joins a node tries.
type countedJoins struct {
	*cluster.DBProvider
	n atomic.Int32
}

func (p *countedJoins) Join(ctx context.Context, scope string, m cluster.Member) error {
	p.n.Add(1)
	return p.DBProvider.Join(ctx, scope, m)
}

// Starting a node while a fenced transaction is open neither waits for it
// nor makes other nodes' lease reads wait: a current schema gets no DDL.
func TestNewDoesNotQueueBehindFencedTransaction(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := start(t, tg, "a")
		reader := start(t, tg, "reader", func(c *cluster.Config) { c.Role = cluster.RoleFollower })
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := a.Fence(ctx, tx); err != nil {
			t.Fatal(err)
		}

		started := make(chan error, 1)
		begin := time.Now()
		go func() {
			cfg := tg.Config(t, tg.Open(t), "b")
			c, err := cluster.New(ctx, cfg)
			if err == nil {
				c.Shutdown(ctx)
			}
			started <- err
		}()
		if tg.Dialect != cluster.SQLite { // SQLite readers never wait for a writer
			time.Sleep(300 * time.Millisecond) // let b reach its schema check; nothing inside New signals it
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := reader.CurrentLeader(rctx)
			cancel()
			if err != nil {
				t.Errorf("a lease read while b starts behind the fenced transaction: %v", err)
			}
		}
		select {
		case err := <-started:
			if err != nil {
				t.Fatalf("New(b) while a fenced transaction is open: %v", err)
			}
			t.Logf("New(b) returned after %v", time.Since(begin).Round(time.Millisecond))
		case <-time.After(4 * time.Second):
			tx.Rollback()
			<-started
			t.Fatalf("New(b) waited for the fenced transaction (still waiting after 4s)")
		}
	})
}

// A leader whose host vanishes inside a fenced transaction blocks a
// takeover for about one LeaseTTL, not until the server notices the dead
// connection: Fence bounds the transaction's idle time on the server.
func TestTakeoverAfterLeaderVanishesInFencedTransaction(t *testing.T) {
	t.Parallel()
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} { // SQLite has no network to lose
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			tg := testdb.New(t, d)
			ctx := context.Background()
			proxy := testdb.NewProxy(t, tg.Addr(t))
			a := startOn(t, tg, tg.OpenDSN(t, tg.WithAddr(t, proxy.Addr)), "a")
			if !a.IsLeader() {
				t.Fatal("a does not lead")
			}
			b := start(t, tg, "b")
			tx, err := a.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Fence(ctx, tx); err != nil {
				t.Fatal(err)
			}
			proxy.Block() // a's host vanishes, its transaction open
			vanished := time.Now()
			ttl := testdb.LeaseTTL
			bound := 2*ttl + time.Second
			took := waitFor(t, bound, "b to take over from a leader that vanished inside a fenced transaction", b.IsLeader)
			t.Logf("b took over %v after a vanished (LeaseTTL %v)", took.Round(time.Millisecond), ttl)
			if b.FencingToken() <= 1 {
				t.Fatalf("b leads with token %d", b.FencingToken())
			}
			_ = vanished
			proxy.Close() // a's connections die; its rollback returns at once
			tx.Rollback()
		})
	}
}

// On MySQL a lease statement never outlives the attempt that sent it: with
// a fenced transaction holding the lease row, the followers' cancelled
// attempts do not pile up on the server waiting for the lock.
func TestMySQLLeaseStatementsEndWithTheirAttempt(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.MySQL)
	ctx := context.Background()
	a := start(t, tg, "a")
	start(t, tg, "b")
	start(t, tg, "c")
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := a.Fence(ctx, tx); err != nil {
		t.Fatal(err)
	}
	const attempts = 25 * testdb.Heartbeat
	time.Sleep(attempts) // a sleep: about 25 attempts per node, to pile up if they would
	var waiting, old int
	err = tg.Open(t).QueryRowContext(ctx,
		"SELECT COUNT(*), COALESCE(SUM(TIME >= 1), 0) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND INFO NOT LIKE '%PROCESSLIST%'",
		"%"+tg.Prefix+"lease%").Scan(&waiting, &old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("lease statements on the server after %v behind a fenced transaction: %d, %d of them older than 1s", attempts, waiting, old)
	if old > 0 || waiting > 3 {
		t.Fatalf("%d lease statements wait on the server (%d older than 1s); want at most one per node, none older than its attempt", waiting, old)
	}
}

// A follower waits a random 80% to 120% of the heartbeat between two
// attempts, not exactly one heartbeat after the last one ended: followers
// that tried together (at a crashed leader's expiry, say) would otherwise
// poll together for good. An attempt starting less than a heartbeat after
// the previous one started can only come from that randomness.
func TestFollowersPollAtRandomIntervals(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		var mu sync.Mutex
		var starts []time.Time
		a := start(t, tg, "a")
		start(t, tg, "b", func(c *cluster.Config) {
			c.Observer = func(o cluster.Operation) {
				if o.Kind == cluster.OpAcquire {
					mu.Lock()
					starts = append(starts, time.Now().Add(-o.Duration))
					mu.Unlock()
				}
			}
		})
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		const gaps = 30
		waitFor(t, 3*gaps*testdb.Heartbeat, "b's attempts", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(starts) > gaps+1
		})
		mu.Lock()
		defer mu.Unlock()
		var short int
		lo, hi := time.Hour, time.Duration(0)
		for i := 2; i <= gaps+1; i++ { // the first attempt is New's
			gap := starts[i].Sub(starts[i-1])
			lo, hi = min(lo, gap), max(hi, gap)
			if gap < testdb.Heartbeat {
				short++
			}
			if gap < testdb.Heartbeat*4/5-5*time.Millisecond {
				t.Errorf("b tried %v after its previous attempt began, under 80%% of the heartbeat (%v)", gap, testdb.Heartbeat)
			}
		}
		t.Logf("%d gaps between b's attempts, %v to %v, %d under one heartbeat", gaps, lo, hi, short)
		if short == 0 {
			t.Errorf("all %d gaps between b's attempts were a heartbeat (%v) or more: it polls in step with the heartbeat", gaps, testdb.Heartbeat)
		}
	})
}

// On PostgreSQL a follower that polls (it hears no releases) and found the
// lease held reads it with a statement that cannot grant and costs the
// server about half an attempt; it attempts only when that read shows the
// lease free or expired, in the same call, so that it still takes over at
// its next poll after a release it did not hear.
func TestPollingFollowerReadsBeforeItAttempts(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	db := tg.Open(t)
	holder, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Init(ctx); err != nil {
		t.Fatal(err)
	}
	// Held for a minute by a node that never renews: b's attempts find it
	// held with a minute left, so each next one is a routine poll.
	if _, err := holder.Acquire(ctx, provider.LeaseRequest{Name: "leader", Holder: "x", Instance: "x-instance", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var sent []string
	pool := recordingPool{cluster.SQLPool(tg.Open(t)), func(q string) {
		mu.Lock()
		sent = append(sent, q)
		mu.Unlock()
	}}
	b := start(t, tg, "b", func(c *cluster.Config) {
		p, err := cluster.NewSQLProvider(pool, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		c.Provider = p
	})
	count := func() (polls, attempts int) {
		mu.Lock()
		defer mu.Unlock()
		for _, q := range sent {
			switch {
			case isWarmUp(q): // a warm-up, after the first refusal
			case strings.Contains(q, "INSERT INTO "+tg.Prefix+"lease"), strings.Contains(q, tg.Prefix+"acquire("):
				attempts++
			case strings.Contains(q, tg.Prefix+"lease l, clock c") && strings.Contains(q, tg.Prefix+"nodes SET last_seen"):
				polls++
			}
		}
		return polls, attempts
	}
	waitFor(t, 3*time.Second, "b to poll five times", func() bool {
		polls, _ := count()
		return polls >= 5
	})
	if b.IsLeader() {
		t.Fatal("b leads a lease held by x")
	}
	if polls, attempts := count(); attempts != 1 {
		t.Fatalf("b made %d attempts and %d polls while x held the lease; want one attempt (its first) and then polls", attempts, polls)
	}
	// A release b does not hear (another process's, with PollOnly).
	if _, err := db.ExecContext(ctx, "UPDATE "+tg.Prefix+"lease SET renewed_at = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, "+
		"expires_at = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint WHERE name = 'leader'"); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 3*time.Second, "b to take over at its next poll", b.IsLeader)
	t.Logf("b led %v after the unheard release (heartbeat %v)", took.Round(time.Millisecond), testdb.Heartbeat)
	if _, attempts := count(); attempts != 2 {
		t.Errorf("b made %d attempts in all; want 2: its first, and the one its poll found the lease free for", attempts)
	}
}

// recordingPool is a provider.Pool that tells record of every statement.
type recordingPool struct {
	provider.Pool
	record func(query string)
}

func (p recordingPool) Conn(ctx context.Context) (provider.Querier, func(), error) {
	q, release, err := p.Pool.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return recordingQuerier{q, p.record}, release, nil
}

type recordingQuerier struct {
	provider.Querier
	record func(query string)
}

func (q recordingQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	q.record(query)
	return q.Querier.Exec(ctx, query, args...)
}

func (q recordingQuerier) QueryRow(ctx context.Context, query string, args ...any) provider.Row {
	q.record(query)
	return q.Querier.QueryRow(ctx, query, args...)
}

// A ResignHoldOff below the longest wait between a polling follower's
// attempts (1.2 heartbeats) lets a resigned node take the lease back first:
// New warns of it, and not of the default.
func TestShortResignHoldOffWarns(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.SQLite)
	for _, c := range []struct {
		holdOff time.Duration
		warn    bool
	}{
		{0, false}, // the default, 1.25 heartbeats
		{testdb.Heartbeat * 6 / 5, false},
		{testdb.Heartbeat, true},
	} {
		logs := &logRecorder{}
		n := start(t, tg, fmt.Sprintf("h%v", c.holdOff), func(cfg *cluster.Config) {
			cfg.ResignHoldOff = c.holdOff
			cfg.Logger = logs.logger(cfg.Logger)
		})
		n.Shutdown(context.Background())
		if got := logs.has("ResignHoldOff is shorter"); got != c.warn {
			t.Errorf("ResignHoldOff %v (heartbeat %v): warned %v, want %v", c.holdOff, testdb.Heartbeat, got, c.warn)
		}
	}
}

// releaseRace stages a release that commits while a renew of the same
// row waits for its lock, on a provider over fresh tables of one dialect.
type releaseRace struct {
	db     *sql.DB
	p      *cluster.DBProvider
	prefix string
	now    string // the database clock in unix ms, as the package's statements read it
	pg     bool
}

func newReleaseRace(t *testing.T, d cluster.Dialect) releaseRace {
	t.Helper()
	tg := testdb.New(t, d)
	return raceOn(t, tg, tg.Open(t))
}

// raceOn is newReleaseRace on db, a pool of tg.
func raceOn(t *testing.T, tg testdb.Target, db *sql.DB) releaseRace {
	t.Helper()
	r := releaseRace{db: db, p: initProvider(t, tg, db), prefix: tg.Prefix, now: dbNow(tg.Dialect), pg: tg.Dialect == cluster.Postgres}
	if tg.Dialect == cluster.MySQL {
		r.now = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000"
	}
	return r
}

// heldLane inserts lane key of scope, held by holder h, instance i, under
// token 1 for a minute.
func (r releaseRace) heldLane(t *testing.T, scope, key string) {
	t.Helper()
	if _, err := r.db.ExecContext(context.Background(), r.bind("INSERT INTO "+r.prefix+"lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) "+
		"VALUES (?, ?, 'h', 'i', 1, "+r.now+", "+r.now+", "+r.now+" + 60000)"), scope, key); err != nil {
		t.Fatal(err)
	}
}

// bind turns q's ? placeholders into PostgreSQL's $n there.
func (r releaseRace) bind(q string) string {
	for i := 1; r.pg && strings.Contains(q, "?"); i++ {
		q = strings.Replace(q, "?", "$"+strconv.Itoa(i), 1)
	}
	return q
}

// run locks the rows of table that match where (with args) in a
// transaction, starts renew, which waits for that lock after reading its
// clock, ends the rows' claim in the locking transaction as a release
// does, and commits. It returns how long the first such row is held
// after (0 or less: released) and renew's error.
func (r releaseRace) run(t *testing.T, table, where string, args []any, renew func() error) (int64, error) {
	t.Helper()
	// One instant for both columns, as a release's statement reads its
	// clock once: PostgreSQL's clock_timestamp() read twice can cross a
	// millisecond and leave expires_at above renewed_at.
	now := r.now
	if r.pg {
		now = "floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint"
	}
	return r.runSet(t, table, where, "renewed_at = "+now+", expires_at = "+now, args, renew)
}

// runSet is run with set, an UPDATE's SET list in which {{now}} is the
// database clock, in place of the release.
func (r releaseRace) runSet(t *testing.T, table, where, set string, args []any, renew func() error) (int64, error) {
	t.Helper()
	set = strings.ReplaceAll(set, "{{now}}", r.now)
	ctx := context.Background()
	table = r.prefix + table
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var one int
	if err := tx.QueryRowContext(ctx, r.bind("SELECT 1 FROM "+table+" WHERE "+where+" FOR UPDATE"), args...).Scan(&one); err != nil {
		t.Fatal(err)
	}
	renewed := make(chan error, 1)
	go func() { renewed <- renew() }()
	time.Sleep(100 * time.Millisecond) // the renew has read its clock
	if _, err := tx.ExecContext(ctx, r.bind("UPDATE "+table+" SET "+set+" WHERE "+where), args...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	renewErr := <-renewed
	var left int64
	if err := r.db.QueryRowContext(ctx, r.bind("SELECT expires_at - "+r.now+" FROM "+table+" WHERE "+where), args...).Scan(&left); err != nil {
		t.Fatal(err)
	}
	return left, renewErr
}

// A lane released while a renew of its holder waits for the row's lock
// stays released. MySQL reads a statement's clock when the statement
// starts, so a renew that started before the release and ran after it
// found the lane unexpired by its earlier clock and extended a claim the
// release had ended (a keeper's renew that Shutdown cancels can still run
// on the server after Shutdown's release: the lane then stayed held by a
// stopped node for a TTL). PostgreSQL's renew skips a locked lane; SQLite
// has one writer at a time, so there a renew cannot start before a
// release and run after it.
func TestLaneRenewDoesNotReviveAReleasedLane(t *testing.T) {
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			r := newReleaseRace(t, d)
			ctx := context.Background()
			r.heldLane(t, "s", "k")
			left, err := r.run(t, "lanes", "scope = ? AND lane = ?", []any{"s", "k"}, func() error {
				_, err := r.p.RenewLanes(ctx, "s", "i", time.Minute, time.Minute)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if left > 0 {
				t.Fatalf("the lane released while a renew waited is held for %d ms more: the renew extended the ended claim", left)
			}
		})
	}
}

// The same for the lease: a term released while its holder's renew waited
// for the row's lock stays released, and the renew reports it lost.
// Resign and Shutdown let a renew in flight finish before they release,
// but not one that outlives Shutdown's grace: cancelled by the client, the
// server may still run it.
func TestRenewDoesNotReviveAReleasedTerm(t *testing.T) {
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			r := newReleaseRace(t, d)
			ctx := context.Background()
			l, err := r.p.Acquire(ctx, provider.LeaseRequest{Name: "leader", Holder: "h", Instance: "i", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			left, err := r.run(t, "lease", "name = ?", []any{"leader"}, func() error {
				_, err := r.p.Renew(ctx, l, time.Minute)
				return err
			})
			if !errors.Is(err, cluster.ErrLeaseLost) {
				t.Errorf("the renew of a term released while it waited returned %v, want ErrLeaseLost", err)
			}
			if left > 0 {
				t.Fatalf("the term released while a renew waited is held for %d ms more: the renew extended it", left)
			}
		})
	}
}

// An operator's release names the term it means by its token and ends
// that term and no other, atomically in the database: a stale token ends
// nothing and says who holds the lease now, and so does a term that
// changes hands while the release waits for the row (a resign, a
// takeover). Before, clusterctl release -force checked the token and then
// ended whatever term the row held, and -yes did not check at all.
func TestOperatorReleaseEndsOnlyTheTermItNames(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		r := raceOn(t, tg, tg.Open(t))
		p := r.p
		l, err := p.Acquire(ctx, provider.LeaseRequest{Name: "leader", Holder: "x", Instance: "xi", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		var held *cluster.LeaseHeldError
		ok, err := p.ForceRelease(ctx, "leader", l.FencingToken-1)
		if ok || !errors.As(err, &held) || held.Holder != "x" || held.FencingToken != l.FencingToken {
			t.Fatalf("ForceRelease of an earlier token = %v, %v; want false and a LeaseHeldError naming x with token %d", ok, err, l.FencingToken)
		}
		if now, err := p.Leader(ctx, "leader"); err != nil || now == nil || now.NodeID != "x" {
			t.Fatalf("after a release of an earlier token the leader is %+v, %v; want x", now, err)
		}

		if tg.Dialect != cluster.SQLite { // SQLite has one writer: no statement waits mid-way
			left, err := r.runSet(t, "lease", "name = ?",
				"holder = 'z', instance = 'zi', fencing_token = fencing_token + 1, acquired_at = {{now}}, renewed_at = {{now}}, expires_at = {{now}} + 60000",
				[]any{"leader"}, func() error {
					ok, err := p.ForceRelease(ctx, "leader", l.FencingToken)
					if ok {
						return errors.New("released")
					}
					return err
				})
			if !errors.As(err, &held) || held.Holder != "z" || held.FencingToken != l.FencingToken+1 {
				t.Fatalf("a release of x's term that waited while z took over = %v; want a LeaseHeldError naming z with token %d", err, l.FencingToken+1)
			}
			if left <= 0 {
				t.Fatalf("z's term, taken while a release of x's waited, was ended (%d ms left)", left)
			}
			l.FencingToken++
		}

		now, err := p.Leader(ctx, "leader")
		if err != nil || now == nil {
			t.Fatal(now, err)
		}
		if ok, err := p.ForceRelease(ctx, "leader", now.FencingToken); !ok || err != nil {
			t.Fatalf("ForceRelease of the current token = %v, %v; want true", ok, err)
		}
		if ok, err := p.ForceRelease(ctx, "leader", now.FencingToken); ok || err != nil {
			t.Fatalf("ForceRelease of a free lease = %v, %v; want false, nil", ok, err)
		}
	})
}

// The same for a lane: the operator's release names the claim by the
// lane's token, and a claim that changes hands while it waits is left
// alone.
func TestOperatorLaneReleaseEndsOnlyTheClaimItNames(t *testing.T) {
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			r := newReleaseRace(t, d)
			ctx := context.Background()
			r.heldLane(t, "s", "k")
			var held *cluster.LaneHeldError
			left, err := r.runSet(t, "lanes", "scope = ? AND lane = ?",
				"holder = 'z', instance = 'zi', fencing_token = 2, acquired_at = {{now}}, renewed_at = {{now}}, expires_at = {{now}} + 60000",
				[]any{"s", "k"}, func() error {
					ok, err := r.p.ForceReleaseLane(ctx, "s", "k", 1)
					if ok {
						return errors.New("released")
					}
					return err
				})
			if !errors.As(err, &held) || held.Holder != "z" || held.FencingToken != 2 {
				t.Fatalf("a release of h's claim that waited while z claimed the lane = %v; want a LaneHeldError naming z with token 2", err)
			}
			if left <= 0 {
				t.Fatalf("z's claim, made while a release of h's waited, was ended (%d ms left)", left)
			}
		})
	}
}

// A lane an operator released while its holder's claim of it (a renewal
// of its own claim) waited for the row's lock stays released: the claim
// does not revive it for another TTL under the same token. MySQL reads
// the statement's clock before the wait, and PostgreSQL re-checks the
// row with the clock it read before; both found the lane unexpired and
// the holder's own.
func TestLaneClaimDoesNotReviveAReleasedLane(t *testing.T) {
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			r := newReleaseRace(t, d)
			ctx := context.Background()
			r.heldLane(t, "s", "k")
			var got cluster.Lane
			left, err := r.run(t, "lanes", "scope = ? AND lane = ?", []any{"s", "k"}, func() error {
				tx, err := r.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				got, err = r.p.ClaimLane(ctx, cluster.TxQuerier(tx), provider.LaneRequest{Scope: "s", Key: "k", Holder: "h", Instance: "i", TTL: time.Minute})
				if err != nil {
					return err
				}
				return tx.Commit()
			})
			t.Logf("claim: %+v, %v; held %d ms more", got, err, left)
			if err == nil && got.FencingToken == 1 || left > 0 && got.FencingToken <= 1 {
				t.Fatalf("the claim that waited for an operator's release = %+v, %v, and the lane is held %d ms more: the claim revived the released claim under token 1", got, err, left)
			}
		})
	}
}

// countingConnector counts the statements sent through its connections.
type countingConnector struct {
	driver.Connector
	n    *atomic.Int64
	only func(query string) bool // counts only these; nil: all
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return countingConn{conn.(fullConn), c.n, c.only}, nil
}

type fullConn interface {
	driver.Conn
	driver.ExecerContext
	driver.QueryerContext
	driver.ConnBeginTx
}

type countingConn struct {
	fullConn
	n    *atomic.Int64
	only func(string) bool
}

func (c countingConn) count(q string) {
	if c.only == nil || c.only(q) {
		c.n.Add(1)
	}
}

func (c countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.count(q)
	return c.fullConn.ExecContext(ctx, q, args)
}

func (c countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.count(q)
	return c.fullConn.QueryContext(ctx, q, args)
}

// dsnConnector is a Connector for a driver that has none.
type dsnConnector struct {
	dsn string
	d   driver.Driver
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.d }

// openCountingOnly is openCounting that counts only the statements only
// accepts.
func openCountingOnly(t *testing.T, tg testdb.Target, n *atomic.Int64, only func(query string) bool) *sql.DB {
	t.Helper()
	base := tg.Open(t)
	var conn driver.Connector = dsnConnector{tg.DSN, base.Driver()}
	if dc, ok := base.Driver().(driver.DriverContext); ok {
		c, err := dc.OpenConnector(tg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		conn = c
	}
	db := sql.OpenDB(countingConnector{conn, n, only})
	t.Cleanup(func() { db.Close() })
	return db
}

// The steady-state load of a three-node cluster: statements per node per
// heartbeat for the leader and for a follower, membership included.
// BENCHMARKS.md quotes the figures this logs:
//
//	go test -run TestSteadyStateStatements -v .
func TestSteadyStateStatements(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		var leaderN, followerN atomic.Int64
		a := startOn(t, tg, openCounting(t, tg, &leaderN), "a")
		b := startOn(t, tg, openCounting(t, tg, &followerN), "b")
		start(t, tg, "c")
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		_ = b
		// Let the start-up settle, then count over many heartbeats.
		time.Sleep(300 * time.Millisecond) // a few heartbeats: not a wait for a transition
		l0, f0 := leaderN.Load(), followerN.Load()
		const beats = 30
		time.Sleep(beats * 100 * time.Millisecond) // counting over a fixed window
		leader := float64(leaderN.Load()-l0) / beats
		follower := float64(followerN.Load()-f0) / beats
		t.Logf("%s: statements per heartbeat: leader %.2f, follower %.2f (LeaseTTL 1s, heartbeat 100ms)", tg.Dialect, leader, follower)
		// Sanity bounds, generous for a loaded machine: the leader renews
		// once per heartbeat (MySQL reads LAST_INSERT_ID back), a follower
		// tries at most once per heartbeat, membership adds a third.
		if leader > 2.6 || follower > 2.6 {
			t.Errorf("more statements than the design allows: leader %.2f, follower %.2f per heartbeat", leader, follower)
		}
	})
}
