package cluster_test

// The helpers the tests of this package share: starting nodes on each
// dialect, fakes, timings, the SQL that tests run beside the library's,
// log recording, and handlers that shut a node down.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudflare/circl/kem"
	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

// node is a cluster member under test with its own connection pool and a
// record of its transitions.
type node struct {
	*cluster.Cluster
	db     *sql.DB
	events *eventLog
}

// start starts a node with id on tg, shut down when the test ends.
func start(t *testing.T, tg testdb.Target, id string, edit ...func(*cluster.Config)) *node {
	t.Helper()
	db := tg.Open(t)
	return startOn(t, tg, db, id, edit...)
}

func startOn(t *testing.T, tg testdb.Target, db *sql.DB, id string, edit ...func(*cluster.Config)) *node {
	t.Helper()
	cfg := tg.Config(t, db, id)
	log := newEventLog()
	cfg.Events = log.ch
	for _, e := range edit {
		e(&cfg)
	}
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", id, err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	return &node{Cluster: c, db: db, events: log}
}

// eventLog records the transitions sent to its channel, which is large
// enough that no test fills it.
type eventLog struct {
	ch     chan cluster.Event
	mu     sync.Mutex
	events []cluster.Event
}

func newEventLog() *eventLog { return &eventLog{ch: make(chan cluster.Event, 4096)} }

// all returns the events sent so far.
func (l *eventLog) all() []cluster.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		select {
		case e := <-l.ch:
			l.events = append(l.events, e)
		default:
			return append([]cluster.Event(nil), l.events...)
		}
	}
}

// receive returns a channel for Config.Events or Notify whose events h
// handles, one at a time in order, on a goroutine of the test's that stops
// at the test's end (after the Shutdowns registered later).
func receive(t *testing.T, h func(cluster.Event)) chan<- cluster.Event {
	ch := make(chan cluster.Event, 4096)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case e := <-ch:
				h(e)
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return ch
}

// wait returns the first event of kind, waiting up to timeout for it.
func (l *eventLog) wait(t *testing.T, kind cluster.EventKind, timeout time.Duration) cluster.Event {
	t.Helper()
	var found cluster.Event
	waitFor(t, timeout, string(kind)+" event", func() bool {
		for _, e := range l.all() {
			if e.Kind == kind {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond) // the polling interval
	}
	return time.Since(start)
}

// leaderOf waits until exactly one of nodes leads and returns it.
func leaderOf(t *testing.T, timeout time.Duration, nodes ...*node) *node {
	t.Helper()
	var leader *node
	waitFor(t, timeout, "one leader", func() bool {
		leader = nil
		for _, n := range nodes {
			if n.IsLeader() {
				if leader != nil {
					return false
				}
				leader = n
			}
		}
		return leader != nil
	})
	return leader
}

// watchSingleLeader samples the nodes until the test ends and fails it if
// two of them believe they lead at the same instant. A node counts as
// leading when two consecutive passes both see it lead; beliefs are
// intervals, so the instant between the passes had both.
func watchSingleLeader(t *testing.T, nodes ...*node) {
	t.Helper()
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		first := make([]bool, len(nodes))
		for !stop.Load() {
			for i, n := range nodes {
				first[i] = n.IsLeader()
			}
			var leaders []string
			for i, n := range nodes {
				if first[i] && n.IsLeader() {
					leaders = append(leaders, n.NodeID())
				}
			}
			if len(leaders) > 1 {
				t.Errorf("two leaders at once: %v", leaders)
				return
			}
			time.Sleep(100 * time.Microsecond) // the sampling interval
		}
	}()
	t.Cleanup(func() {
		stop.Store(true)
		<-done
	})
}

// fakeProvider is a Provider whose behaviour each test sets.
type fakeProvider struct {
	AcquireFunc func(context.Context, provider.LeaseRequest) (provider.Lease, error)
	RenewFunc   func(context.Context, provider.Lease, time.Duration) (provider.Lease, error)
	ReleaseFunc func(context.Context, provider.Lease) error
	LeaderFunc  func(context.Context, string) (*cluster.Leader, error)
}

var _ provider.Provider = (*fakeProvider)(nil)

func (f *fakeProvider) Acquire(ctx context.Context, r provider.LeaseRequest) (provider.Lease, error) {
	if f.AcquireFunc == nil {
		return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, Endpoint: r.Endpoint, FencingToken: 1}, nil
	}
	return f.AcquireFunc(ctx, r)
}

func (f *fakeProvider) Renew(ctx context.Context, l provider.Lease, ttl time.Duration) (provider.Lease, error) {
	if f.RenewFunc == nil {
		return l, nil
	}
	return f.RenewFunc(ctx, l, ttl)
}

func (f *fakeProvider) Release(ctx context.Context, l provider.Lease) error {
	if f.ReleaseFunc == nil {
		return nil
	}
	return f.ReleaseFunc(ctx, l)
}

func (f *fakeProvider) Leader(ctx context.Context, name string) (*cluster.Leader, error) {
	if f.LeaderFunc == nil {
		return nil, nil
	}
	return f.LeaderFunc(ctx, name)
}

// fakeConfig is a configuration over p with the test timings.
func fakeConfig(t *testing.T, id string, p provider.Provider) cluster.Config {
	return cluster.Config{
		NodeID:            id,
		Provider:          p,
		LeaseTTL:          testdb.LeaseTTL,
		HeartbeatInterval: testdb.Heartbeat,
		FenceTimeout:      testdb.FenceTimeout,
		Logger:            testdb.Logger(t),
	}
}

// startFake starts a node over the fake provider p, shut down when the
// test ends.
func startFake(t *testing.T, p provider.Provider) *node {
	t.Helper()
	log := newEventLog()
	cfg := fakeConfig(t, "a", p)
	cfg.Events = log.ch
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	return &node{Cluster: c, events: log}
}

// leaderProvider grants every acquisition with token 1 and reports the
// last holder as leader.
func leaderProvider() *fakeProvider {
	var holder atomic.Value
	holder.Store("")
	return &fakeProvider{
		AcquireFunc: func(_ context.Context, r provider.LeaseRequest) (provider.Lease, error) {
			holder.Store(r.Holder)
			return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: 1}, nil
		},
		LeaderFunc: func(context.Context, string) (*cluster.Leader, error) {
			return &cluster.Leader{NodeID: holder.Load().(string), FencingToken: 1}, nil
		},
	}
}

// initFailer is a store that cannot be prepared, as an unreachable
// database: Init fails with err, so New and cluster.Init do.
type initFailer struct {
	provider.Provider
	err error
}

func (p initFailer) Init(context.Context) error { return p.err }

// leaseBook is a one-lease store for a fake provider: it grants the lease
// when free, renews and releases only the term that holds it.
type leaseBook struct {
	mu       sync.Mutex
	holder   string // instance holding the lease, "" when free
	token    uint64
	failRen  bool // renews fail with a transient error
	released chan uint64
}

func newLeaseBook() *leaseBook { return &leaseBook{released: make(chan uint64, 16)} }

func (b *leaseBook) provider() *fakeProvider {
	return &fakeProvider{
		AcquireFunc: func(_ context.Context, r provider.LeaseRequest) (provider.Lease, error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.holder != "" {
				return provider.Lease{}, &cluster.LeaseHeldError{Holder: "other", Instance: b.holder, FencingToken: b.token, Remaining: time.Second}
			}
			b.token++
			b.holder = r.Instance
			return provider.Lease{Name: r.Name, Holder: r.Holder, Instance: r.Instance, FencingToken: b.token}, nil
		},
		RenewFunc: func(_ context.Context, l provider.Lease, _ time.Duration) (provider.Lease, error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			switch {
			case b.holder != l.Instance || b.token != l.FencingToken:
				return l, cluster.ErrLeaseLost
			case b.failRen:
				return l, errors.New("store unavailable")
			}
			return l, nil
		},
		ReleaseFunc: func(_ context.Context, l provider.Lease) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.holder == l.Instance && (l.FencingToken == 0 || l.FencingToken == b.token) {
				b.holder = ""
				b.released <- b.token
			}
			return nil
		},
	}
}

// take hands the lease to another node behind its holder's back.
func (b *leaseBook) take() {
	b.mu.Lock()
	b.token++
	b.holder = "other-instance"
	b.mu.Unlock()
}

func (b *leaseBook) failRenews() {
	b.mu.Lock()
	b.failRen = true
	b.mu.Unlock()
}

func (b *leaseBook) held() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.holder != "" && b.holder != "other-instance"
}

// startBook starts node "a" over book with the handler h, then the
// handlers of edit.
func startBook(t *testing.T, book *leaseBook, h *handlerShutdown, edit ...func(*cluster.Config)) *node {
	t.Helper()
	log := newEventLog()
	cfg := fakeConfig(t, "a", book.provider())
	cfg.Events = log.ch
	withHandler(t, h.handle)(&cfg)
	for _, e := range edit {
		e(&cfg)
	}
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	h.give(c)
	return &node{Cluster: c, events: log}
}

// slowRenew makes a node renew every 2s instead of every testdb.Heartbeat,
// so that it goes on believing it leads for a while after its lease was
// ended behind its back.
func slowRenew(c *cluster.Config) {
	c.LeaseTTL = 5 * time.Second
	c.HeartbeatInterval = 2 * time.Second
	c.FenceTimeout = 4 * time.Second
}

// longLease gives a node a 10s lease instead of testdb.LeaseTTL, so that a
// quick takeover can only come from a release, not from the lease
// expiring.
func longLease(c *cluster.Config) {
	c.LeaseTTL = 10 * time.Second
	c.FenceTimeout = 5 * time.Second
}

// bind rewrites ? placeholders for PostgreSQL.
func bind(d cluster.Dialect, q string) string {
	if d != cluster.Postgres {
		return q
	}
	out := make([]byte, 0, len(q)+8)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			out = append(out, '$')
			out = strconv.AppendInt(out, int64(n), 10)
			continue
		}
		out = append(out, q[i])
	}
	return string(out)
}

// leaseRow is the timing of the lease row.
type leaseRow struct{ renewed, expires int64 }

// readLease reads the timing of the lease row.
func readLease(t *testing.T, tg testdb.Target, db *sql.DB) leaseRow {
	t.Helper()
	var r leaseRow
	if err := db.QueryRow("SELECT renewed_at, expires_at FROM "+tg.Prefix+"lease").Scan(&r.renewed, &r.expires); err != nil {
		t.Fatal(err)
	}
	return r
}

// afterRenew returns just after the lease row was renewed.
func afterRenew(t *testing.T, tg testdb.Target, db *sql.DB) {
	t.Helper()
	before := readLease(t, tg, db)
	waitFor(t, 5*time.Second, "a renew", func() bool { return readLease(t, tg, db).renewed != before.renewed })
}

// expireLease ends the current term in the database, as the passing of its
// TTL would while its holder is paused.
func expireLease(t *testing.T, tg testdb.Target, db *sql.DB) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), "UPDATE "+tg.Prefix+"lease SET expires_at = 0"); err != nil {
		t.Fatal(err)
	}
}

// createAuditTable creates a hash-chained table <prefix>audit with the
// default column names.
func createAuditTable(t *testing.T, tg testdb.Target, db *sql.DB) string {
	t.Helper()
	name := tg.Prefix + "audit"
	ddl := map[cluster.Dialect]string{
		cluster.Postgres: "CREATE TABLE " + name + " (monotonic_counter BIGINT PRIMARY KEY, row_hash BYTEA NOT NULL, payload TEXT NOT NULL)",
		cluster.MySQL:    "CREATE TABLE " + name + " (monotonic_counter BIGINT PRIMARY KEY, row_hash VARBINARY(64) NOT NULL, payload TEXT NOT NULL) ENGINE=InnoDB",
		cluster.SQLite:   "CREATE TABLE " + name + " (monotonic_counter INTEGER PRIMARY KEY, row_hash BLOB NOT NULL, payload TEXT NOT NULL)",
	}[tg.Dialect]
	if _, err := db.ExecContext(context.Background(), ddl); err != nil {
		t.Fatal(err)
	}
	return name
}

// hashOf is a stand-in row hash for counter n.
func hashOf(n int, salt string) []byte {
	return []byte{byte(n >> 8), byte(n), 0xfe, salt[0], 0x01, 0x02, 0x03, 0x04, 0x05}
}

// appendAudit appends rows from..to to the audit table through n, each in
// a fenced transaction that advances the chain's tip.
func appendAudit(t *testing.T, tg testdb.Target, n *node, table string, from, to int) {
	t.Helper()
	appendAuditSalted(t, tg, n, table, from, to, "a")
}

// appendAuditSalted is appendAudit with rows whose hashes differ from
// another salt's at the same counters: another history.
func appendAuditSalted(t *testing.T, tg testdb.Target, n *node, table string, from, to int, salt string) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := auditRow(context.Background(), tg, n, table, i, salt); err != nil {
			t.Fatal(err)
		}
	}
}

// auditRow appends row i to the audit table through n in a fenced
// transaction that advances the chain's tip.
func auditRow(ctx context.Context, tg testdb.Target, n *node, table string, i int, salt string) error {
	tx, err := n.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := n.Fence(ctx, tx); err != nil {
		return fmt.Errorf("Fence: %w", err)
	}
	h := hashOf(i, salt)
	if _, err := tx.ExecContext(ctx, bind(tg.Dialect, "INSERT INTO "+table+" (monotonic_counter, row_hash, payload) VALUES (?, ?, ?)"), i, h, "event"); err != nil {
		return err
	}
	if err := n.AdvanceTip(ctx, tx, "audit", uint64(i), h); err != nil {
		return fmt.Errorf("AdvanceTip(%d): %w", i, err)
	}
	return tx.Commit()
}

// auditLeader creates the audit table and starts node "a" over it, which
// appends rows 1..rows. It returns a's pool, the table and a.
func auditLeader(t *testing.T, tg testdb.Target, rows int) (*sql.DB, string, *node) {
	t.Helper()
	db := tg.Open(t)
	table := createAuditTable(t, tg, db)
	a := startOn(t, tg, db, "a", withAudit(table))
	appendAudit(t, tg, a, table, 1, rows)
	return db, table, a
}

// withAudit configures the audit chain.
func withAudit(table string) func(*cluster.Config) {
	return func(c *cluster.Config) {
		c.Chains = []cluster.Chain{{Name: "audit", Table: table}}
	}
}

// restoreChain puts the audit chain back to counter k as a restore of the
// whole database would: it removes the guard triggers, rewrites the rows
// they protect, and clears the schema version so the next New recreates
// the triggers.
func restoreChain(t *testing.T, tg testdb.Target, db *sql.DB, table string, k int) {
	t.Helper()
	ctx := context.Background()
	var list string
	switch tg.Dialect {
	case cluster.Postgres:
		list = "SELECT t.tgname || ' ON ' || c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal AND c.relname LIKE '" + tg.Prefix + "%'"
	case cluster.MySQL:
		list = "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME LIKE '" + tg.Prefix + "%'"
	case cluster.SQLite:
		list = "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE '" + tg.Prefix + "%'"
	}
	rows, err := db.QueryContext(ctx, list)
	if err != nil {
		t.Fatal(err)
	}
	var triggers []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		triggers = append(triggers, n)
	}
	rows.Close()
	if len(triggers) == 0 {
		t.Fatal("no triggers found to remove")
	}
	for _, n := range triggers {
		if _, err := db.ExecContext(ctx, "DROP TRIGGER "+n); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []struct {
		q    string
		args []any
	}{
		{"DELETE FROM " + table + " WHERE monotonic_counter > ?", []any{k}},
		{"UPDATE " + tg.Prefix + "chain_tips SET at_counter = ?, row_hash = ? WHERE scope = 'audit'", []any{k, hashOf(k, "a")}},
		{"UPDATE " + tg.Prefix + "high_water SET value = ? WHERE scope = 'chain/audit'", []any{k}},
		{"DELETE FROM " + tg.Prefix + "schema_version", nil},
	} {
		if _, err := db.ExecContext(ctx, bind(tg.Dialect, st.q), st.args...); err != nil {
			t.Fatalf("restore: %s: %v", st.q, err)
		}
	}
}

// deleteOnAcquire installs a trigger that deletes the row at counter from
// the chain table whenever the lease row changes, so an acquisition finds
// the chain rolled back although the check at boot passed.
func deleteOnAcquire(t *testing.T, tg testdb.Target, db *sql.DB, table string, counter int) {
	t.Helper()
	ctx := context.Background()
	name := tg.Prefix + "delete_on_acquire"
	del := "DELETE FROM " + table + " WHERE monotonic_counter = " + strconv.Itoa(counter)
	var stmts []string
	switch tg.Dialect {
	case cluster.SQLite:
		stmts = []string{"CREATE TRIGGER " + name + " AFTER UPDATE ON " + tg.Prefix + "lease BEGIN " + del + "; END"}
	case cluster.MySQL:
		stmts = []string{"CREATE TRIGGER " + name + " AFTER UPDATE ON " + tg.Prefix + "lease FOR EACH ROW " + del}
	case cluster.Postgres:
		stmts = []string{
			"CREATE FUNCTION " + name + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN " + del + "; RETURN NULL; END $$",
			"CREATE TRIGGER " + name + " AFTER UPDATE ON " + tg.Prefix + "lease FOR EACH ROW EXECUTE FUNCTION " + name + "()",
		}
		t.Cleanup(func() { db.ExecContext(context.Background(), "DROP FUNCTION IF EXISTS "+name+"() CASCADE") })
	}
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}

// createWriteLog creates <prefix>seq, a one-row counter, and <prefix>writes,
// where fencedWrite appends (seq, token, node) rows.
func createWriteLog(t *testing.T, tg testdb.Target, db *sql.DB) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE " + tg.Prefix + "seq (id INTEGER PRIMARY KEY, n BIGINT NOT NULL)",
		"INSERT INTO " + tg.Prefix + "seq (id, n) VALUES (1, 0)",
		"CREATE TABLE " + tg.Prefix + "writes (seq BIGINT PRIMARY KEY, token BIGINT NOT NULL, node VARCHAR(16) NOT NULL)",
	} {
		if _, err := db.ExecContext(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
}

// fencedWrite appends one row to the write log in a transaction fenced by
// fence. The row's seq comes from the locked counter row, so seq order is
// commit order; its token is the one fence verified.
func fencedWrite(ctx context.Context, db *sql.DB, fence func(context.Context, cluster.Tx) (uint64, error), d cluster.Dialect, prefix, node string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	token, err := fence(ctx, tx)
	if err != nil {
		return err
	}
	lock := " FOR UPDATE"
	if d == cluster.SQLite {
		lock = "" // the write transaction is already exclusive
	}
	var s int64
	if err := tx.QueryRowContext(ctx, "SELECT n FROM "+prefix+"seq WHERE id = 1"+lock).Scan(&s); err != nil {
		return err
	}
	s++
	if _, err := tx.ExecContext(ctx, bind(d, "UPDATE "+prefix+"seq SET n = ? WHERE id = 1"), s); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, bind(d, "INSERT INTO "+prefix+"writes (seq, token, node) VALUES (?, ?, ?)"), s, token, node); err != nil {
		return err
	}
	return tx.Commit()
}

// writeLog is a row of the write log.
type writeLog struct {
	seq, token int64
	node       string
}

// readWriteLog returns the write log in commit order, failing the test if
// a token ever decreases along it.
func readWriteLog(t *testing.T, tg testdb.Target, db *sql.DB) []writeLog {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), "SELECT seq, token, node FROM "+tg.Prefix+"writes ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []writeLog
	for rows.Next() {
		var w writeLog
		if err := rows.Scan(&w.seq, &w.token, &w.node); err != nil {
			t.Fatal(err)
		}
		if n := len(out); n > 0 && w.token < out[n-1].token {
			t.Fatalf("commit %d by %s has token %d after commit %d with token %d", w.seq, w.node, w.token, out[n-1].seq, out[n-1].token)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// beginImmediate takes SQLite's write lock on db until the transaction
// ends.
func beginImmediate(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil) // the test DSN uses _txlock=immediate
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// newerSchema makes the target's tables carry a schema version newer than
// this build's, so New fails with ErrSchema, and returns the undo.
func newerSchema(t *testing.T, tg testdb.Target, db *sql.DB) (undo func()) {
	t.Helper()
	ctx := context.Background()
	table := tg.Prefix + "schema_version"
	for _, q := range []string{
		"CREATE TABLE " + table + " (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
		"INSERT INTO " + table + " (version, applied_at) VALUES (999, 0)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		if _, err := db.ExecContext(ctx, "DELETE FROM "+table); err != nil {
			t.Fatal(err)
		}
	}
}

var guardCode = regexp.MustCompile(`SF\d{3}`)

// refusedWith runs q and fails the test unless a guard refuses it with
// SQLSTATE code, which must classify as the sentinel want.
func refusedWith(t *testing.T, tg testdb.Target, q sqlRunner, code string, want error, query string, args ...any) {
	t.Helper()
	_, err := q.ExecContext(context.Background(), query, args...)
	if err == nil {
		t.Errorf("accepted, want refusal %s: %s", code, query)
		return
	}
	if got := guardCode.FindString(err.Error()); got != code {
		t.Errorf("refused with %v, want guard %s: %s", err, code, query)
		return
	}
	if got := cluster.ClassifyDBError(tg.Dialect, err); !errors.Is(got, want) {
		t.Errorf("guard %s classifies as %v, want %v", code, got, want)
	}
}

type sqlRunner interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// logRecorder keeps the messages of the records logged through it.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) logger(next *slog.Logger) *slog.Logger {
	return slog.New(recordingHandler{r: r, next: next.Handler()})
}

func (r *logRecorder) add(msg string) {
	r.mu.Lock()
	r.msgs = append(r.msgs, msg)
	r.mu.Unlock()
}

func (r *logRecorder) has(part string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, part) {
			return true
		}
	}
	return false
}

type recordingHandler struct {
	r    *logRecorder
	next slog.Handler
}

func (h recordingHandler) Enabled(ctx context.Context, l slog.Level) bool { return true }

func (h recordingHandler) Handle(ctx context.Context, rec slog.Record) error {
	h.r.add(rec.Message)
	return h.next.Handle(ctx, rec)
}

func (h recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recordingHandler{r: h.r, next: h.next.WithAttrs(as)}
}

func (h recordingHandler) WithGroup(name string) slog.Handler {
	return recordingHandler{r: h.r, next: h.next.WithGroup(name)}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// handlerShutdown is an event handler (see receive) that calls Shutdown on the first
// event it matches. Hand it its Cluster with give once New returns: an
// event emitted during New waits for it.
type handlerShutdown struct {
	match  func(cluster.Event) bool
	call   func(context.Context) error // what the handler calls; default the Cluster's Shutdown
	ready  chan *cluster.Cluster
	result chan error
	fired  atomic.Bool
}

func shutdownOn(match func(cluster.Event) bool) *handlerShutdown {
	return &handlerShutdown{match: match, ready: make(chan *cluster.Cluster, 1), result: make(chan error, 1)}
}

func shutdownOnKind(kind cluster.EventKind) *handlerShutdown {
	return shutdownOn(func(e cluster.Event) bool { return e.Kind == kind })
}

func (h *handlerShutdown) give(c *cluster.Cluster) { h.ready <- c }

func (h *handlerShutdown) handle(e cluster.Event) {
	if !h.match(e) || h.fired.Swap(true) {
		return
	}
	call := h.call
	if call == nil {
		call = (<-h.ready).Shutdown
	}
	h.result <- call(context.Background())
}

// wait fails the test unless the handler's Shutdown returned within the
// bound, and returns its result.
func (h *handlerShutdown) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-h.result:
		return err
	case <-time.After(shutdownBound):
		t.Fatalf("Shutdown called from a handler did not return within %v", shutdownBound)
		return nil
	}
}

// withHandler has h handle the config's events on a goroutine of the
// test's (see receive), after passing each on to the channel the config
// already has.
func withHandler(t *testing.T, h func(cluster.Event)) func(*cluster.Config) {
	return func(c *cluster.Config) {
		prev := c.Events
		c.Events = receive(t, func(e cluster.Event) {
			if prev != nil {
				prev <- e
			}
			h(e)
		})
	}
}

// shutdownBound is how long a Shutdown may take in these tests: a release
// is bounded by one heartbeat (testdb.Heartbeat).
const shutdownBound = 3 * time.Second

// shutdownWithin calls Shutdown from the test and fails unless it returns
// within the bound.
func shutdownWithin(t *testing.T, c *cluster.Cluster) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownBound)
	defer cancel()
	return c.Shutdown(ctx)
}

// shutdownWithinDefault is shutdownWithin for the default instance.
func shutdownWithinDefault(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownBound)
	defer cancel()
	return cluster.Shutdown(ctx)
}

// initProvider returns the default provider over db, its tables created.
func initProvider(t *testing.T, tg testdb.Target, db *sql.DB) *cluster.DBProvider {
	t.Helper()
	p, err := cluster.NewDBProvider(db, "", tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

// useDefault gives the test a default instance on which Init was never
// called, and shuts it down and forgets it when the test ends.
func useDefault(t *testing.T) {
	t.Helper()
	cluster.ResetDefault()
	t.Cleanup(func() {
		cluster.Shutdown(context.Background())
		cluster.ResetDefault()
	})
}

// get calls h and returns the status, the headers and the decoded body.
func get(t *testing.T, h http.Handler, method string) (int, http.Header, map[string]any, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, "/cluster/leader", nil))
	raw := rec.Body.String()
	var body map[string]any
	if method != http.MethodHead {
		if err := json.Unmarshal([]byte(raw), &body); err != nil {
			t.Fatalf("body %q is not JSON: %v", raw, err)
		}
	}
	return rec.Code, rec.Header(), body, raw
}

// recordingTx is a provider.Querier over tx that records the statements.
type recordingTx struct {
	tx      *sql.Tx
	queries []string
	after   func(query string) // if set, runs after each statement
}

// untouchedTx is a Tx for calls that must not run a statement in it (the
// default instance when Init was never called, or in a state that fails
// closed): any statement fails, so a call that touched it would return
// that error instead of the one the test wants.
type untouchedTx struct{}

// probe serves one request to h and returns the status and JSON body.
func probe(t *testing.T, h http.Handler, method string) (int, map[string]any, http.Header) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, "/", nil))
	var body map[string]any
	if method == http.MethodGet && strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: body %q: %v", method, rec.Body.String(), err)
		}
	}
	if method == http.MethodHead && rec.Body.Len() != 0 {
		t.Fatalf("HEAD answered with a body: %q", rec.Body.String())
	}
	return rec.Code, body, rec.Header()
}

// slowSeen is the default provider whose membership refreshes (Seen)
// last until their deadline: a members table whose rows are locked, or a
// database too busy for membership writes.
type slowSeen struct {
	*cluster.DBProvider
	n atomic.Int32
}

// openCounting opens tg through a connector that counts statements.
func openCounting(t *testing.T, tg testdb.Target, n *atomic.Int64) *sql.DB {
	t.Helper()
	return openCountingOnly(t, tg, n, nil)
}

// slow gives nodes a poll so slow (every 5s) that a takeover within a
// fraction of it can only come from a wake-up.
func slow(c *cluster.Config) {
	c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 15*time.Second, 5*time.Second, 10*time.Second
}

// expectedLaneRefusal reports an error a lane worker expects: the lane is
// another node's, or the worker's node is gone.
func expectedLaneRefusal(err error) bool {
	return errors.Is(err, cluster.ErrLaneHeld) || errors.Is(err, cluster.ErrLaneLimit) ||
		errors.Is(err, cluster.ErrShutdown) || errors.Is(err, sql.ErrConnDone) ||
		strings.Contains(err.Error(), "database is closed")
}

// joinFailsOnce is the default provider whose first membership join fails,
// as under write contention at start.
type joinFailsOnce struct {
	*cluster.DBProvider
	failed atomic.Bool
}

// claimLane claims key for n in a transaction of its own, committed.
func claimLane(ctx context.Context, n *node, key string) (uint64, error) {
	tx, err := n.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	token, err := n.ClaimLane(ctx, tx, key)
	if err != nil {
		return 0, err
	}
	return token, tx.Commit()
}

// createLaneLog creates <prefix>lane_seq, a counter per lane, and
// <prefix>lane_writes, where laneWrite appends (lane, seq, token, node).
func createLaneLog(t *testing.T, tg testdb.Target, db *sql.DB) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE " + tg.Prefix + "lane_seq (lane VARCHAR(64) PRIMARY KEY, n BIGINT NOT NULL)",
		"CREATE TABLE " + tg.Prefix + "lane_writes (lane VARCHAR(64) NOT NULL, seq BIGINT NOT NULL, token BIGINT NOT NULL, node VARCHAR(16) NOT NULL, PRIMARY KEY (lane, seq))",
	} {
		if _, err := db.ExecContext(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
}

// laneWrite appends one row to lane key's log in a transaction that
// begins with ClaimLane: the row's seq comes from the lane's counter,
// read after the claim, so seq order is the lane's commit order; its
// token is the one the claim returned.
func laneWrite(ctx context.Context, n *node, d cluster.Dialect, prefix, key string) (uint64, error) {
	return laneWriteOn(ctx, n.Cluster, n.db, d, prefix, key)
}

// laneWriteOn is laneWrite for a member c writing through db.
func laneWriteOn(ctx context.Context, c *cluster.Cluster, db *sql.DB, d cluster.Dialect, prefix, key string) (uint64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	token, err := c.ClaimLane(ctx, tx, key)
	if err != nil {
		return 0, err
	}
	var s int64
	err = tx.QueryRowContext(ctx, bind(d, "SELECT n FROM "+prefix+"lane_seq WHERE lane = ?"), key).Scan(&s)
	switch {
	case err == sql.ErrNoRows:
		if _, err := tx.ExecContext(ctx, bind(d, "INSERT INTO "+prefix+"lane_seq (lane, n) VALUES (?, 0)"), key); err != nil {
			return 0, err
		}
	case err != nil:
		return 0, err
	}
	s++
	if _, err := tx.ExecContext(ctx, bind(d, "UPDATE "+prefix+"lane_seq SET n = ? WHERE lane = ?"), s, key); err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, bind(d, "INSERT INTO "+prefix+"lane_writes (lane, seq, token, node) VALUES (?, ?, ?, ?)"), key, s, token, c.NodeID()); err != nil {
		return 0, err
	}
	return token, tx.Commit()
}

// readLaneLog returns each lane's log in commit order, failing the test
// if a lane's token ever decreases along it, or if one token of a lane
// was written by two nodes.
func readLaneLog(t *testing.T, tg testdb.Target, db *sql.DB) map[string][]laneEntry {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), "SELECT lane, seq, token, node FROM "+tg.Prefix+"lane_writes ORDER BY lane, seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]laneEntry{}
	owner := map[string]string{} // lane/token -> node
	for rows.Next() {
		var lane string
		var e laneEntry
		if err := rows.Scan(&lane, &e.seq, &e.token, &e.node); err != nil {
			t.Fatal(err)
		}
		log := out[lane]
		if n := len(log); n > 0 && e.token < log[n-1].token {
			t.Fatalf("lane %s: commit %d by %s has token %d after commit %d with token %d", lane, e.seq, e.node, e.token, log[n-1].seq, log[n-1].token)
		}
		id := fmt.Sprintf("%s/%d", lane, e.token)
		if o, ok := owner[id]; ok && o != e.node {
			t.Fatalf("lane %s: token %d written by %s and %s", lane, e.token, o, e.node)
		}
		owner[id] = e.node
		out[lane] = append(log, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// watchLaneOwners samples OwnsLane on every node for every key until the
// test ends, and fails it if two nodes own one lane at the same instant
// (both seen owning it in two consecutive passes).
func watchLaneOwners(t *testing.T, keys []string, nodes ...*node) {
	t.Helper()
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		first := make([][]bool, len(nodes))
		for i := range first {
			first[i] = make([]bool, len(keys))
		}
		for !stop.Load() {
			for i, n := range nodes {
				for j, k := range keys {
					first[i][j] = n.OwnsLane(k)
				}
			}
			for j, k := range keys {
				var owners []string
				for i, n := range nodes {
					if first[i][j] && n.OwnsLane(k) {
						owners = append(owners, n.NodeID())
					}
				}
				if len(owners) > 1 {
					t.Errorf("lane %s owned by %v at once", k, owners)
					return
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	t.Cleanup(func() {
		stop.Store(true)
		<-done
	})
}

// laneWorker writes to the keys it owns, in a loop, and tries the others
// every fourth round, until stopped: what a partitioned consumer does,
// polling its own keys (OwnsLane) and looking for free ones now and then.
// Refused claims are expected.
type laneWorker struct {
	stop  chan struct{}
	done  sync.WaitGroup
	mu    sync.Mutex
	wrote map[string]int
	errs  []error
}

func startLaneWorker(t *testing.T, tg testdb.Target, n *node, keys []string, pause time.Duration) *laneWorker {
	t.Helper()
	w := &laneWorker{stop: make(chan struct{}), wrote: map[string]int{}}
	w.done.Go(func() {
		ctx := context.Background()
		for round := 0; ; round++ {
			for _, k := range keys {
				select {
				case <-w.stop:
					return
				default:
				}
				if round%4 != 0 && !n.OwnsLane(k) {
					continue
				}
				_, err := laneWrite(ctx, n, tg.Dialect, tg.Prefix, k)
				w.mu.Lock()
				switch {
				case err == nil:
					w.wrote[k]++
				case expectedLaneRefusal(err):
				default:
					w.errs = append(w.errs, err)
				}
				w.mu.Unlock()
				if err == nil {
					// Leave SQLite's write lock to the others a moment, as a
					// worker doing real work between transactions would.
					time.Sleep(5 * time.Millisecond)
				}
			}
			select {
			case <-w.stop:
				return
			case <-time.After(pause):
			}
		}
	})
	t.Cleanup(w.halt)
	return w
}

// lanesOf returns how many of keys each node owns.
func lanesOf(keys []string, nodes ...*node) []int {
	out := make([]int, len(nodes))
	for i, n := range nodes {
		for _, k := range keys {
			if n.OwnsLane(k) {
				out[i]++
			}
		}
	}
	return out
}

// sqlLaneTarget is the lane suite's target on tg: the default provider,
// with claims in database/sql transactions.
func sqlLaneTarget(t *testing.T, tg testdb.Target) providertest.LaneTarget {
	t.Helper()
	db := tg.Open(t)
	initProvider(t, tg, db)
	return providertest.LaneTarget{
		Open: func() provider.LaneStore { return initProvider(t, tg, tg.Open(t)) },
		Begin: func(ctx context.Context) (providertest.Tx, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			return providertest.SQLTx(tx), nil
		},
	}
}

// dbNow is the database clock in unix ms on d, as the package reads it.
func dbNow(d cluster.Dialect) string {
	if d == cluster.SQLite {
		return "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
	}
	return "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
}

// unknownDriver is a database/sql driver the package cannot identify.
type unknownDriver struct{}

// longestSchemaSuffix reads the schema files for the longest identifier
// they build from the table prefix, {{prefix}} followed by [a-z0-9_]+, and
// returns what follows the prefix.
func longestSchemaSuffix(t testing.TB) string {
	t.Helper()
	files, err := filepath.Glob("schema/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("schema files: %v, %v", files, err)
	}
	longest := ""
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`\{\{prefix\}\}([a-z0-9_]+)`).FindAllSubmatch(b, -1) {
			if len(m[1]) > len(longest) {
				longest = string(m[1])
			}
		}
	}
	return longest
}

// opLog records what Config.Observer is told.
type opLog struct {
	mu  sync.Mutex
	ops []cluster.Operation
}

// fpOf returns the fingerprint of a ring of one ML-KEM-768 key derived from
// seed offset off.
func fpOf(t *testing.T, off byte) string {
	t.Helper()
	fp, err := cluster.VaultKeyFingerprint(vaultKey(t, mlkem768, off))
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// vaultNode starts a node with vault keys derived from off, or returns the
// error New returned.
func vaultNode(t *testing.T, tg testdb.Target, id string, off byte, edit ...func(*cluster.Config)) (*node, error) {
	t.Helper()
	cfg := tg.Config(t, tg.Open(t), id)
	cfg.VaultKeys = []kem.PublicKey{vaultKey(t, mlkem768, off)}
	log := newEventLog()
	cfg.Events = log.ch
	for _, e := range edit {
		e(&cfg)
	}
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	return &node{Cluster: c, events: log}, nil
}

func (r *recordingTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return nil, errors.New("recordingTx: use Exec")
}

func (r *recordingTx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	r.queries = append(r.queries, query)
	res, err := r.tx.ExecContext(ctx, query, args...)
	if r.after != nil {
		r.after(query)
	}
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (r *recordingTx) QueryRow(ctx context.Context, query string, args ...any) provider.Row {
	r.queries = append(r.queries, query)
	if r.after == nil {
		return r.tx.QueryRowContext(ctx, query, args...)
	}
	return afterScan{r.tx.QueryRowContext(ctx, query, args...), func() { r.after(query) }}
}

func (p *slowSeen) Seen(ctx context.Context, scope, instance string) error {
	p.n.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

func (p *joinFailsOnce) Join(ctx context.Context, scope string, m cluster.Member) error {
	if !p.failed.Swap(true) {
		return errors.New("join the cluster: context deadline exceeded")
	}
	return p.DBProvider.Join(ctx, scope, m)
}

// halt stops the worker and waits for it; it may be called again.
func (w *laneWorker) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.done.Wait()
}

// unexpected returns the errors other than refused claims.
func (w *laneWorker) unexpected() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.errs)
}

func (l *opLog) add(o cluster.Operation) {
	l.mu.Lock()
	l.ops = append(l.ops, o)
	l.mu.Unlock()
}

func (l *opLog) count(kind cluster.OpKind, outcome cluster.Outcome) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.ops {
		if o.Kind == kind && o.Outcome == outcome {
			n++
		}
	}
	return n
}
