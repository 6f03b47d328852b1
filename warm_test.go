package cluster_test

import (
	"context"
	"errors"
	"strings"
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
