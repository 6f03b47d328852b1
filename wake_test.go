package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// Nodes of one process on one provider hand off without waiting for a
// poll, on every dialect: a release through the provider wakes the others
// at once. A provider that wraps the default one by delegation keeps it
// (providertest checks the same for every provider).
func TestInProcessWakeUp(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		p, err := cluster.NewDBProvider(tg.Open(t), tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		testdb.ResignWakesSharer(t, tg, p)
	})
}

// A PostgreSQL release commits with synchronous_commit off for its own
// transaction only: the connection it ran on goes back to the pool with
// the server's setting, so the application's commits on it stay durable.
func TestReleaseLeavesSynchronousCommitAlone(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	db := tg.Open(t)
	db.SetMaxOpenConns(1) // the release and the check below share the connection
	var before string
	if err := db.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&before); err != nil {
		t.Fatal(err)
	}
	a := startOn(t, tg, db, "a")
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := p.Leader(ctx, "leader"); err != nil || l != nil {
		t.Fatalf("after Shutdown the lease is held by %+v (%v); want it released", l, err)
	}
	var after string
	if err := db.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("synchronous_commit on the release's connection is %q after the release, %q before", after, before)
	}
}

// A PostgreSQL attempt that is refused commits without waiting for its
// WAL flush (its one write is the membership heartbeat); one that grants
// waits for it, as the term must outlive a server crash. The test runs the
// attempt inside a transaction of its own, where the setting the
// statement made for its transaction can still be read.
func TestRefusedAttemptCommitsAsynchronously(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	a := start(t, tg, "a")
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	db := tg.Open(t)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The session counts as warmed up, so no warm-up (which sets the
	// setting itself, for its scratch grants) runs after a refusal.
	if _, err := conn.ExecContext(ctx, "SELECT set_config('sqlfence."+tg.Prefix+"warm', '1', false)"); err != nil {
		t.Fatal(err)
	}
	var server string
	if err := conn.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&server); err != nil {
		t.Fatal(err)
	}
	if server == "off" {
		t.Skip("the server commits asynchronously anyway (synchronous_commit = off)")
	}
	for _, c := range []struct {
		lease, want string
		granted     bool
	}{
		{"leader", "off", false},    // a holds it
		{"elsewhere", server, true}, // free: granted
	} {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := cluster.NewSQLProvider(txPool{tx}, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Acquire(ctx, provider.LeaseRequest{Name: c.lease, Holder: "b", Instance: "b-instance", TTL: testdb.LeaseTTL})
		var held *cluster.LeaseHeldError
		if got := err == nil; got != c.granted || (!got && !errors.As(err, &held)) {
			t.Fatalf("Acquire(%q) = %v, want granted %v", c.lease, err, c.granted)
		}
		var setting string
		if err := tx.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&setting); err != nil {
			t.Fatal(err)
		}
		if setting != c.want {
			t.Errorf("Acquire(%q), granted %v: synchronous_commit = %q for its transaction, want %q", c.lease, c.granted, setting, c.want)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}
	// Both in one transaction: the refusal's setting must not carry over
	// to the grant.
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	p, err := cluster.NewSQLProvider(txPool{tx}, tg.Dialect, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	var held *cluster.LeaseHeldError
	if _, err := p.Acquire(ctx, provider.LeaseRequest{Name: "leader", Holder: "b", Instance: "b-instance", TTL: testdb.LeaseTTL}); !errors.As(err, &held) {
		t.Fatalf("Acquire(leader) = %v, want the lease held by a", err)
	}
	if _, err := p.Acquire(ctx, provider.LeaseRequest{Name: "elsewhere", Holder: "b", Instance: "b-instance", TTL: testdb.LeaseTTL}); err != nil {
		t.Fatalf("Acquire(elsewhere) = %v, want it granted", err)
	}
	var setting string
	if err := tx.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting != "on" {
		t.Errorf("a grant after a refusal in one transaction: synchronous_commit = %q, want on", setting)
	}
}

// txPool is a provider.Pool whose every connection is tx.
type txPool struct{ tx *sql.Tx }

func (p txPool) Conn(context.Context) (provider.Querier, func(), error) {
	return &recordingTx{tx: p.tx}, func() {}, nil
}

// New returns only once the node hears the releases of the other nodes on
// its provider: a release right after New returned (a Resign a few
// milliseconds after the follower started) would otherwise find nobody
// to wake, and the follower would wait for its poll. Shutdown removes the
// node; PollOnly watches nothing.
func TestNewReturnsHearing(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.SQLite)
	p, err := cluster.NewDBProvider(tg.Open(t), tg.Dialect, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	shared := func(c *cluster.Config) { c.DB, c.Provider = nil, p }
	var nodes []*node
	for i := range 30 {
		nodes = append(nodes, start(t, tg, fmt.Sprintf("n%d", i), slow, shared))
		if got := cluster.LocalWatchers(p, "leader"); got != i+1 {
			t.Fatalf("right after New of node %d, %d nodes hear releases through the provider; want %d", i+1, got, i+1)
		}
	}
	start(t, tg, "polling", slow, shared, func(c *cluster.Config) { c.PollOnly = true })
	if got := cluster.LocalWatchers(p, "leader"); got != 30 {
		t.Fatalf("with a PollOnly node, %d nodes hear releases; want the other 30", got)
	}
	for i, n := range nodes {
		if err := n.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := cluster.LocalWatchers(p, "leader"); got != len(nodes)-i-1 {
			t.Fatalf("after %d Shutdowns %d nodes hear releases; want %d", i+1, got, len(nodes)-i-1)
		}
	}
}
