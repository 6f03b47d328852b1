package cluster_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster/internal/testdb"
)

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

// openCounting opens tg through a connector that counts statements.
func openCounting(t *testing.T, tg testdb.Target, n *atomic.Int64) *sql.DB {
	t.Helper()
	return openCountingOnly(t, tg, n, nil)
}

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
