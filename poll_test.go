package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

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
