package clusterpgx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
	"github.com/sqlfence/cluster/internal/testdb"
)

// sentLog records what a pool sends: each batch's statements and each
// statement sent on its own.
type sentLog struct {
	mu      sync.Mutex
	batches [][]string
	singles []string
}

func (l *sentLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.singles = append(l.singles, d.SQL)
	return ctx
}

func (l *sentLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *sentLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b []string
	for _, q := range d.Batch.QueuedQueries {
		b = append(b, q.SQL)
	}
	l.batches = append(l.batches, b)
	return ctx
}

func (l *sentLog) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (l *sentLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (l *sentLog) reset() (batches [][]string, singles []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	batches, singles = l.batches, l.singles
	l.batches, l.singles = nil, nil
	return batches, singles
}

// BeginFenced begins and fences a pgx transaction in one batch (the BEGIN
// and the fence's read of the lease row, nothing sent before), holds the
// lease row until the transaction ends, refuses a stale leader without
// leaving a transaction or a pool connection behind, and honours the
// transaction options.
func TestBeginFenced(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	log := &sentLog{}
	cfg, err := pgxpool.ParseConfig(tg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = log
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	admin := newPool(t, tg, 0)
	orders := tg.Prefix + "orders"
	if _, err := admin.Exec(ctx, "CREATE TABLE "+orders+" (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	slow := func(c *cluster.Config) {
		// a renews rarely, so it still believes it leads after the takeover.
		c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 5*time.Second, 2*time.Second, 4*time.Second
	}
	a := node(t, tg, newPool(t, tg, 0), "a", slow)
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}

	if _, _, err := clusterpgx.BeginFenced(ctx, a, nil, pgx.TxOptions{}); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("BeginFenced on a nil pool = %v, want ErrInvalidConfig", err)
	}

	log.reset()
	tx, token, err := clusterpgx.BeginFenced(ctx, a, app, pgx.TxOptions{})
	if err != nil {
		t.Fatalf("BeginFenced by the leader: %v", err)
	}
	if token != a.FencingToken() || token == 0 {
		t.Errorf("BeginFenced returned token %d; the leader's is %d", token, a.FencingToken())
	}
	batches, singles := log.reset()
	if len(batches) != 1 || len(batches[0]) != 2 || !strings.HasPrefix(strings.ToLower(batches[0][0]), "begin") ||
		!strings.Contains(batches[0][1], tg.Prefix+"lease") || len(singles) != 0 {
		t.Fatalf("BeginFenced sent batches %q and statements %q; want one batch of the BEGIN and the fence, nothing else", batches, singles)
	}
	// The lease row is held until the transaction ends: no new term can be
	// granted meanwhile.
	if _, err := admin.Exec(ctx, "SELECT 1 FROM "+tg.Prefix+"lease FOR UPDATE NOWAIT"); !isLockNotAvailable(err) {
		t.Errorf("locking the lease row during a fenced transaction = %v, want lock_not_available (55P03)", err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (token) VALUES ($1)", int64(token)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if _, err := admin.Exec(ctx, "SELECT 1 FROM "+tg.Prefix+"lease FOR UPDATE NOWAIT"); err != nil {
		t.Errorf("the lease row is still locked after the commit: %v", err)
	}

	// Options reach the BEGIN.
	tx, _, err = clusterpgx.BeginFenced(ctx, a, app, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	var iso string
	if err := tx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil || iso != "serializable" {
		t.Errorf("isolation in a serializable BeginFenced = %q (%v)", iso, err)
	}
	tx.Rollback(ctx)
	// A read-only transaction cannot hold the lease row: refused, saying
	// so, and nothing left open.
	tx, _, err = clusterpgx.BeginFenced(ctx, a, app, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if !errors.Is(err, cluster.ErrReadOnly) || tx != nil || !strings.Contains(err.Error(), "READ ONLY") {
		t.Errorf("a read-only BeginFenced = %v, %v; want nil and ErrReadOnly naming READ ONLY", tx, err)
	}
	if n := app.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d pool connections still acquired after a refused read-only BeginFenced; want 0", n)
	}

	// A takeover behind a's back: its next BeginFenced is refused.
	if _, err := admin.Exec(ctx, "UPDATE "+tg.Prefix+"lease SET expires_at = 0"); err != nil {
		t.Fatal(err)
	}
	b := node(t, tg, newPool(t, tg, 0), "b", slow)
	if !b.IsLeader() || !a.IsLeader() {
		t.Fatalf("want b leading and a still believing it does: a %v, b %v", a.IsLeader(), b.IsLeader())
	}
	tx, token, err = clusterpgx.BeginFenced(ctx, a, app, pgx.TxOptions{})
	if !errors.Is(err, cluster.ErrStaleFencingToken) || tx != nil || token != 0 {
		t.Fatalf("BeginFenced by the stale leader = %v, %d, %v; want nil, 0, ErrStaleFencingToken", tx, token, err)
	}
	if n := app.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d pool connections still acquired after a refused BeginFenced; want 0", n)
	}
	// A follower sends nothing.
	f := node(t, tg, newPool(t, tg, 0), "f", slow)
	log.reset()
	if _, _, err := clusterpgx.BeginFenced(ctx, f, app, pgx.TxOptions{}); !errors.Is(err, cluster.ErrNotLeader) {
		t.Fatalf("BeginFenced by a follower = %v, want ErrNotLeader", err)
	}
	if batches, singles := log.reset(); len(batches)+len(singles) != 0 {
		t.Errorf("BeginFenced by a follower sent %q and %q; want nothing", batches, singles)
	}
	// Inside a transaction: refused before anything is sent.
	outer, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := clusterpgx.BeginFenced(ctx, b, outer, pgx.TxOptions{}); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Errorf("BeginFenced on a pgx.Tx = %v, want ErrInvalidConfig", err)
	}
	outer.Rollback(ctx)
	tx, token, err = clusterpgx.BeginFenced(ctx, b, app, pgx.TxOptions{})
	if err != nil || token != b.FencingToken() {
		t.Fatalf("BeginFenced by the new leader = %d, %v; want its token %d", token, err, b.FencingToken())
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (token) VALUES ($1)", int64(token)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+orders).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d orders committed (%v); want the two leaders' one each", n, err)
	}
}

// Without cluster.Init the process is the only writer: BeginFenced with a
// nil Cluster begins a plain transaction and returns token 0.
func TestBeginFencedWithoutInit(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, tg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// pgxpool's Close waits for every connection to come back: with
		// one leaked it would hang the test rather than fail it (goleak
		// then reports the pool's goroutines).
		if pool.Stat().AcquiredConns() == 0 {
			pool.Close()
		}
	}()
	tx, token, err := clusterpgx.BeginFenced(ctx, cluster.Default(), pool, pgx.TxOptions{})
	if err != nil || token != 0 {
		t.Fatalf("BeginFenced without Init = %d, %v; want 0, nil", token, err)
	}
	defer tx.Rollback(ctx)
	var inTx bool
	if err := tx.QueryRow(ctx, "SELECT now() = statement_timestamp()").Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if inTx {
		t.Error("the statement ran outside a transaction block (now() equals its own start time)")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A BEGIN that fails gives the pool's connection back.
	if _, _, err := clusterpgx.BeginFenced(ctx, nil, pool, pgx.TxOptions{BeginQuery: "BEGIN garbage"}); err == nil {
		t.Fatal("BeginFenced with a malformed BEGIN succeeded")
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d pool connections still acquired after a failed BEGIN; want 0", n)
	}
}

func isLockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// A nil pool or transaction, typed or not, is an error naming the call,
// not a panic; a nil Cluster is the default instance (without Init:
// nothing to fence, token 0).
func TestNilArgumentsAreErrors(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	pool := newPool(t, tg, 0)
	a := node(t, tg, newPool(t, tg, 0), "a", nil)
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	try := func(name string, call func() error) {
		t.Helper()
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("%s panics: %v", name, r)
			}
		}()
		if err := call(); !errors.Is(err, cluster.ErrInvalidConfig) {
			t.Errorf("%s = %v; want ErrInvalidConfig", name, err)
		}
	}
	try("BeginFenced on a nil *pgxpool.Pool", func() error {
		_, _, err := clusterpgx.BeginFenced(ctx, a, (*pgxpool.Pool)(nil), pgx.TxOptions{})
		return err
	})
	try("BeginFenced on a nil *pgx.Conn", func() error {
		_, _, err := clusterpgx.BeginFenced(ctx, a, (*pgx.Conn)(nil), pgx.TxOptions{})
		return err
	})
	try("BeginFenced with a nil *cluster.Cluster", func() error {
		_, _, err := clusterpgx.BeginFenced(ctx, nil, pool, pgx.TxOptions{})
		return err
	})
	for _, c := range []*cluster.Cluster{a, cluster.Default()} {
		try(fmt.Sprintf("Fence(Tx(nil)) on %p", c), func() error { _, err := c.Fence(ctx, clusterpgx.Tx(pgx.Tx(nil))); return err })
		try(fmt.Sprintf("ClaimLane(Tx(nil)) on %p", c), func() error { _, err := c.ClaimLane(ctx, clusterpgx.Tx(nil), "k"); return err })
		try(fmt.Sprintf("AdvanceTip(Tx(nil)) on %p", c), func() error { return c.AdvanceTip(ctx, clusterpgx.Tx(nil), "audit", 1, []byte{1}) })
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if token, err := cluster.Default().Fence(ctx, clusterpgx.Tx(tx)); err != nil || token != 0 {
		t.Errorf("Fence on the default instance, without Init = %d, %v; want 0, nil", token, err)
	}
	if token, err := a.Fence(ctx, clusterpgx.Tx(tx)); err != nil || token != a.FencingToken() {
		t.Errorf("Fence by the leader = %d, %v; want %d, nil", token, err, a.FencingToken())
	}
}
