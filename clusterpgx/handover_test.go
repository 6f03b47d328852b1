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
	"github.com/sqlfence/cluster/clusterpgx"
	"github.com/sqlfence/cluster/internal/testdb"
)

// otherProcess is the test's own connection standing in for a node of
// another process: it holds the lease as holder "elsewhere", instance
// "elsewhere-1", for ttl, and hands it over as that node's release would.
type otherProcess struct {
	t     *testing.T
	tg    testdb.Target
	admin *pgxpool.Pool
}

// newOtherProcess creates the tables and returns the stand-in.
func newOtherProcess(t *testing.T, tg testdb.Target) otherProcess {
	t.Helper()
	admin := newPool(t, tg, 0)
	if err := provider(t, tg, admin).Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return otherProcess{t, tg, admin}
}

// member adds an active membership row under lease "leader" for a node
// that has run longest (started at 0), last seen seenAgo ago.
func (o otherProcess) member(instance, id, endpoint string, hears int, seenAgo time.Duration) {
	o.t.Helper()
	if _, err := o.admin.Exec(context.Background(), "INSERT INTO "+o.tg.Prefix+"nodes (scope, instance, node_id, host, pid, endpoint, started_at, last_seen, status, hears_releases) "+
		"VALUES ('leader', $1, $2, 'h', 1, $3, 0, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - $4::bigint, 'active', $5)",
		instance, id, endpoint, seenAgo.Milliseconds(), hears); err != nil {
		o.t.Fatal(err)
	}
}

// hold takes the lease and returns its fencing token.
func (o otherProcess) hold(ttl time.Duration) int64 {
	o.t.Helper()
	var granted bool
	var token int64
	if err := o.admin.QueryRow(context.Background(), "SELECT granted, fencing_token FROM "+o.tg.Prefix+"acquire($1, $2, $3, '', $4)",
		"elsewhere", "elsewhere-1", ttl.Milliseconds(), "leader").Scan(&granted, &token); err != nil || !granted {
		o.t.Fatalf("take the lease for another process: granted %v, %v", granted, err)
	}
	return token
}

// handOver releases the term with token as a node's release does, and
// returns the successor's node id ("" for none), whether it was handed
// the term, the token after, and the term's length by the database clock.
func (o otherProcess) handOver(token int64) (successor string, handed bool, after, lasts int64) {
	o.t.Helper()
	var expires, now int64
	if err := o.admin.QueryRow(context.Background(),
		"SELECT COALESCE((SELECT node_id FROM "+o.tg.Prefix+"nodes n WHERE n.instance = r.successor AND n.scope = 'leader'), r.successor), r.handed, r.fencing_token, r.expires_at, r.now_ms FROM "+
			o.tg.Prefix+"hand_over($1, $2, $3, $4, 33) r", "leader", "elsewhere", "elsewhere-1", token).
		Scan(&successor, &handed, &after, &expires, &now); err != nil {
		o.t.Fatal(err)
	}
	return successor, handed, after, expires - now
}

// A release hands the next term to the member it names, in one
// statement; that member, in another process, reads the term (no grant
// of its own: its token is the one the release granted, and its pool
// sends no acquire statement), leads, and renews at once, for a whole
// TTL. In the same process it usually runs no statement before it leads.
func TestReleaseHandsTermToSuccessor(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	other := newOtherProcess(t, tg)
	admin := other.admin
	token := other.hold(time.Minute)

	bLog := &connLog{}
	b := node(t, tg, tracedPool(t, tg, bLog), "b", longPoll)
	waitFor(t, 3*time.Second, "b to hear releases", func() bool { return b.Stats().HearingReleases })
	waitHears(t, tg, admin, "leader", "b")
	time.Sleep(1200 * time.Millisecond) // b's attempts at start and within half a heartbeat of listening land

	before := len(bLog.all())
	successor, handed, after, lasts := other.handOver(token)
	if successor != "b" || !handed || after != token+1 {
		t.Fatalf("the release named %q, handed %v, token %d; want b handed token %d", successor, handed, after, token+1)
	}
	if lasts != (time.Minute * 33 / 100).Milliseconds() {
		t.Errorf("the handed term lasts %d ms, want a third of the ending term's TTL", lasts)
	}
	took := waitFor(t, time.Second, "b to lead", b.IsLeader)
	if got := b.FencingToken(); got != uint64(after) {
		t.Fatalf("b leads with token %d, want the handed term's %d (a grant of its own would be %d)", got, after, after+1)
	}
	var adopted, acquired int
	for _, s := range bLog.all()[before:] {
		switch {
		case strings.Contains(s.sql, "acquire(") && len(s.args) > 0:
			acquired++
		case strings.Contains(s.sql, "expires_at > c.now_ms") && strings.Contains(s.sql, "holder = $2"):
			adopted++
		}
	}
	if adopted != 1 || acquired != 0 {
		t.Fatalf("b read the handed term %d times and sent %d acquire statements; want 1 and 0", adopted, acquired)
	}
	// b renews the short term at once: a whole TTL from its renew.
	waitFor(t, time.Second, "b's renew to extend the handed term to a TTL", func() bool {
		var ttl, tok int64
		if err := admin.QueryRow(ctx, "SELECT expires_at - renewed_at, fencing_token FROM "+tg.Prefix+"lease WHERE name = 'leader'").Scan(&ttl, &tok); err != nil {
			t.Fatal(err)
		}
		return tok == after && ttl == (6*time.Second).Milliseconds()
	})
	t.Logf("b led %v after the release, by the term it was handed", took.Round(time.Millisecond))

	// In one process: b hands over to c by Shutdown; c learns the term
	// from b's release and sends nothing before it leads.
	cLog := &connLog{}
	c := node(t, tg, tracedPool(t, tg, cLog), "c", longPoll)
	waitHears(t, tg, admin, "leader", "c")
	time.Sleep(1200 * time.Millisecond)
	before = len(cLog.all())
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "c to lead", c.IsLeader)
	if got := c.FencingToken(); got != uint64(after+1) {
		t.Fatalf("c leads with token %d, want %d", got, after+1)
	}
	// Usually c takes the term from b's release, with no statement; when
	// b's LISTEN delivers the release's grant before the release
	// statement returns to b, c reads its term, as from another process.
	reads := 0
	for _, s := range cLog.all()[before:] {
		if strings.Contains(s.sql, "holder = $2") {
			reads++
		}
	}
	t.Logf("c read its term %d times", reads)
}

// A release hands the next term only to a member that records that it
// takes handed-over terms (hears_releases 2: nodes of version 5 record 1
// and are only named), that was seen within the ending term's TTL (one
// seen longer ago may be gone), and never for an operator's release (no
// holder). The notifications say, in order: the grant when there was
// one, who is named, and the lease name alone (nodes of version 4).
func TestHandOverOnlyToMembersThatTakeIt(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	other := newOtherProcess(t, tg)
	admin := other.admin
	listener := listenToReleases(t, tg)
	member := func(hears int, seenAgo time.Duration) {
		t.Helper()
		if _, err := admin.Exec(ctx, "DELETE FROM "+tg.Prefix+"nodes"); err != nil {
			t.Fatal(err)
		}
		other.member("m-1", "m", "m:1", hears, seenAgo)
	}
	notified := func(want ...string) {
		t.Helper()
		for _, w := range want {
			nctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			n, err := listener.WaitForNotification(nctx)
			cancel()
			if err != nil || n.Payload != w {
				t.Fatalf("notification %q (%v), want %q", n.Payload, err, w)
			}
		}
	}
	for _, c := range []struct {
		what    string
		hears   int
		seenAgo time.Duration
		handed  bool
	}{
		{"a member of version 5", 1, 0, false},
		{"a member seen 1.5 TTLs ago", 2, 15 * time.Second, false},
		{"a member seen lately", 2, time.Second, true},
	} {
		member(c.hears, c.seenAgo)
		token := other.hold(10 * time.Second)
		notified("leader\telsewhere-1") // the grant to the other process
		successor, handed, after, lasts := other.handOver(token)
		if successor != "m" || handed != c.handed {
			t.Fatalf("%s: named %q, handed %v; want m, handed %v", c.what, successor, handed, c.handed)
		}
		if c.handed {
			if after != token+1 || lasts != 3300 {
				t.Fatalf("%s: token %d, lasting %d ms; want %d, 3300 ms", c.what, after, lasts, token+1)
			}
			notified("leader\tm-1", "leader\nm-1", "leader")
			var holder, endpoint string
			if err := admin.QueryRow(ctx, "SELECT holder, endpoint FROM "+tg.Prefix+"lease WHERE name = 'leader'").Scan(&holder, &endpoint); err != nil || holder != "m" || endpoint != "m:1" {
				t.Fatalf("%s: the lease row names holder %q at %q (%v), want m at m:1", c.what, holder, endpoint, err)
			}
			// The handed term expires unless its holder renews it.
			if _, err := admin.Exec(ctx, "UPDATE "+tg.Prefix+"lease SET expires_at = 0"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if after != token || lasts != 0 {
			t.Fatalf("%s: token %d, lasting %d ms after the release; want %d, free", c.what, after, lasts, token)
		}
		notified("leader\nm-1", "leader")
	}
	// An operator's release hands nothing over.
	member(2, 0)
	token := other.hold(10 * time.Second)
	notified("leader\telsewhere-1")
	var successor string
	var handed bool
	if err := admin.QueryRow(ctx, "SELECT successor, handed FROM "+tg.Prefix+"hand_over('leader', NULL, NULL, NULL, 0)").Scan(&successor, &handed); err != nil || successor != "m-1" || handed {
		t.Fatalf("an operator's release named %q, handed %v (%v); want m-1 named only", successor, handed, err)
	}
	var after int64
	if err := admin.QueryRow(ctx, "SELECT fencing_token FROM "+tg.Prefix+"lease WHERE name = 'leader'").Scan(&after); err != nil || after != token {
		t.Fatalf("token %d after an operator's release (%v), want %d", after, err, token)
	}
}

// A successor handed the term but gone (it crashed without leaving, and
// the database saw it lately) holds the lease only for the handed term, a
// third of the TTL: the others, told of the handover, try once it has
// expired, long before the term they knew of would have (a follower that
// hears releases sleeps until then).
func TestHandedTermOfVanishedSuccessorExpires(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	other := newOtherProcess(t, tg)
	admin := other.admin
	token := other.hold(6 * time.Second) // b's TTL: its handed terms last as long as this one's
	b := node(t, tg, newPool(t, tg, 0), "b", longPoll)
	waitHears(t, tg, admin, "leader", "b")
	time.Sleep(1200 * time.Millisecond)        // b's attempts at start land: it sleeps until the term expires
	other.member("ghost-1", "ghost", "", 2, 0) // it has run longest: the release names it
	start := time.Now()
	successor, handed, after, lasts := other.handOver(token)
	if successor != "ghost" || !handed || lasts != 1980 {
		t.Fatalf("named %q, handed %v, lasting %d ms; want the ghost handed 1980 ms", successor, handed, lasts)
	}
	waitFor(t, 5*time.Second, "b to take over from the ghost", b.IsLeader)
	took := time.Since(start)
	if took < 1900*time.Millisecond || took > 3500*time.Millisecond {
		t.Fatalf("b led %v after the handover; want soon after the ghost's term of 1980 ms ended, not at the expiry of the term b knew of (about 4.5 s)", took)
	}
	if got := b.FencingToken(); got != uint64(after+1) {
		t.Fatalf("b leads with token %d, want %d", got, after+1)
	}
	t.Logf("b took over %v after the release handed the term to a member that was gone", took.Round(time.Millisecond))
}

// A member handed the term that cannot lead (it holds off after its own
// Resign) ends that term without handing it on, and the others try at
// once: the next member named, holding off too, passes the turn, and the
// third leads within milliseconds, not when the handed term expires.
func TestSuccessorThatCannotLeadPassesHandedTerm(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	admin := newPool(t, tg, 0)
	holdOff := func(c *cluster.Config) {
		longPoll(c)
		c.ResignHoldOff = 5 * time.Second
	}
	b := node(t, tg, newPool(t, tg, 0), "b", holdOff) // runs longest: named first
	c := node(t, tg, newPool(t, tg, 0), "c", holdOff)
	d := node(t, tg, newPool(t, tg, 0), "d", holdOff)
	for _, id := range []string{"b", "c", "d"} {
		waitHears(t, tg, admin, "leader", id)
	}
	if !b.IsLeader() {
		t.Fatal("b, started first, does not lead")
	}
	if err := b.Resign(ctx); err != nil { // to c, the longest-running other
		t.Fatal(err)
	}
	waitFor(t, time.Second, "c to lead", c.IsLeader)
	handed := c.FencingToken()
	start := time.Now()
	if err := c.Resign(ctx); err != nil { // to b, which holds off
		t.Fatal(err)
	}
	waitFor(t, time.Second, "d to lead", d.IsLeader)
	took := time.Since(start)
	if took > 500*time.Millisecond {
		t.Fatalf("d led %v after c resigned; the handed term (2 s) was not passed on", took)
	}
	if b.IsLeader() || c.IsLeader() {
		t.Fatal("a node holding off after Resign leads")
	}
	if got := d.FencingToken(); got != handed+2 {
		t.Fatalf("d leads with token %d, want %d (b was handed %d)", got, handed+2, handed+1)
	}
	t.Logf("d led %v after c resigned to b, which holds off", took.Round(time.Millisecond))
}

// A node whose attempt finds an unexpired term under its own instance (a
// release handed it over unheard, or its own grant's answer was lost)
// takes that term up, trusting it from the attempt's start for what the
// database says is left, rather than releasing it and asking again: its
// token is that term's, not the next.
func TestNodeTakesUpItsOwnTermFoundByAttempt(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	other := newOtherProcess(t, tg)
	admin := other.admin
	token := other.hold(time.Minute)
	b := node(t, tg, newPool(t, tg, 0), "b", func(c *cluster.Config) {
		c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 3*time.Second, 100*time.Millisecond, 2*time.Second
		c.PollOnly = true // it polls every heartbeat and hears nothing
	})
	var instance string
	waitFor(t, 2*time.Second, "b to be a member", func() bool {
		ms, err := b.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.NodeID == "b" && m.Status == "active" {
				instance = m.Instance
			}
		}
		return instance != ""
	})
	if _, err := admin.Exec(ctx, "UPDATE "+tg.Prefix+"lease SET holder = 'b', instance = $1, fencing_token = $2, "+
		"expires_at = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 1000 WHERE name = 'leader'", instance, token+1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "b to lead", b.IsLeader)
	if got := b.FencingToken(); got != uint64(token+1) {
		t.Fatalf("b leads with token %d, want %d, the term it found under its name", got, token+1)
	}
	// Renewed at once, for a whole TTL.
	waitFor(t, time.Second, "b's renew", func() bool {
		var ttl int64
		if err := admin.QueryRow(ctx, "SELECT expires_at - renewed_at FROM "+tg.Prefix+"lease WHERE name = 'leader' AND fencing_token = $1", token+1).Scan(&ttl); err != nil {
			t.Fatal(err)
		}
		return ttl == 3000
	})
}

// A release that hands the term over is an acquisition of the next token
// like any other: it waits for the fenced transactions of the ending term
// (Fence holds the lease row): the release blocks until the fenced
// transaction has committed, so every write fenced with token T commits
// before the term T+1 is granted, and the successor leads only after.
func TestHandoverWaitsForFencedTransactions(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	app := newPool(t, tg, 0)
	a := node(t, tg, newPool(t, tg, 0), "a", longPoll)
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	b := node(t, tg, newPool(t, tg, 0), "b", longPoll)
	waitHears(t, tg, app, "leader", "b")
	tx, token, err := clusterpgx.BeginFenced(ctx, a, app, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	resigned := make(chan error, 1)
	go func() { resigned <- a.Resign(ctx) }()
	time.Sleep(300 * time.Millisecond)
	if b.IsLeader() {
		t.Fatal("b leads while a transaction fenced with a's token is open")
	}
	select {
	case err := <-resigned:
		t.Fatalf("a's release returned (%v) while a transaction fenced with its token is open", err)
	default:
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // the transaction goes on under the ending term
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the fenced transaction of token %d did not commit: %v", token, err)
	}
	if err := <-resigned; err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "b to lead", b.IsLeader)
	if got := b.FencingToken(); got != token+1 {
		t.Fatalf("b leads with token %d, want %d, handed over", got, token+1)
	}
}

// failingReads fails the next reads of a handed term (the "adopt"
// query) its pool sends once armed, before they reach the server, as a
// broken connection or a cancelled context would fail them; it lets
// everything else through and counts the reads and acquire statements
// sent since.
type failingReads struct {
	mu              sync.Mutex
	fail            int // reads still to fail
	reads, acquires int
	failed          int
}

// arm fails the next n reads and starts the counts again.
func (f *failingReads) arm(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail, f.reads, f.acquires, f.failed = n, 0, 0, 0
}

func (f *failingReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case strings.Contains(d.SQL, "acquire(") && len(d.Args) > 0:
		f.acquires++
	case strings.Contains(d.SQL, "expires_at > c.now_ms") && strings.Contains(d.SQL, "holder = $2"):
		f.reads++
		if f.fail > 0 {
			f.fail--
			f.failed++
			failed, cancel := context.WithCancel(ctx)
			cancel()
			return failed
		}
	}
	return ctx
}

func (f *failingReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (f *failingReads) counts() (reads, acquires, failed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads, f.acquires, f.failed
}

// A successor whose read of the term handed to it fails does not lead on
// it: the failed read is a failed attempt, after which the node does not
// know whether it holds the lease. Its next attempt, a heartbeat later,
// finds the term still its own and takes it up (the handed token, not a
// grant of its own), and Shutdown releases it.
func TestFailedReadOfHandedTerm(t *testing.T) {
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	other := newOtherProcess(t, tg)
	admin := other.admin
	token := other.hold(time.Minute)

	reads := &failingReads{}
	var acquireErrors atomic.Int64
	b := node(t, tg, tracedPool(t, tg, reads), "b", func(cfg *cluster.Config) {
		longPoll(cfg)
		cfg.Observer = func(o cluster.Operation) {
			if o.Kind == cluster.OpAcquire && o.Outcome == cluster.OutcomeError {
				acquireErrors.Add(1)
			}
		}
	})
	waitHears(t, tg, admin, "leader", "b")
	time.Sleep(1200 * time.Millisecond) // b's attempts at start land (and the warm-up, a read too): it sleeps until the term expires

	reads.arm(1)
	start := time.Now()
	successor, handed, after, _ := other.handOver(token)
	if successor != "b" || !handed {
		t.Fatalf("the release named %q, handed %v; want b handed the term", successor, handed)
	}
	waitFor(t, 5*time.Second, "b to lead", b.IsLeader)
	took := time.Since(start)
	if got := b.FencingToken(); got != uint64(after) {
		t.Fatalf("b leads with token %d, want the handed term's %d", got, after)
	}
	n, acquires, failed := reads.counts()
	if failed != 1 {
		t.Fatalf("%d reads of the handed term failed; want the first one", failed)
	}
	if n < 2 && acquires == 0 {
		t.Fatalf("b led after %d reads of its term and %d acquire statements, one read failed: it led on a read that failed", n, acquires)
	}
	if got := acquireErrors.Load(); got != 1 {
		t.Errorf("b's observer saw %d failed attempts; want one, the failed read", got)
	}
	t.Logf("b led %v after the handover, its first read failing (%d reads, %d acquire statements)", took.Round(time.Millisecond), n, acquires)

	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	var left int64
	if err := admin.QueryRow(ctx, "SELECT expires_at - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM "+tg.Prefix+"lease WHERE name = 'leader'").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left > 0 {
		t.Fatalf("after b's Shutdown the lease is held for %d ms more; want it released", left)
	}
}
