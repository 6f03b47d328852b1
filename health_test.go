package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// Health is 200 while the node reaches the database, 503 with a short
// reason (never the database's words) once it has not for FenceTimeout,
// and after Shutdown; the leader check is 200 on the leader only; both
// answer GET and HEAD with no-store, and 405 otherwise.
func TestHealthAndLeaderCheck(t *testing.T) {
	t.Parallel()
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} { // SQLite has no network to cut
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			tg := testdb.New(t, d)
			proxy := testdb.NewProxy(t, tg.Addr(t))
			a := startOn(t, tg, tg.OpenDSN(t, tg.WithAddr(t, proxy.Addr)), "a")
			f := start(t, tg, "f", func(c *cluster.Config) { c.Role = cluster.RoleFollower })
			for _, m := range []string{http.MethodGet, http.MethodHead} {
				if code, _, h := probe(t, a.HealthHandler(), m); code != http.StatusOK || h.Get("Cache-Control") != "no-store" {
					t.Fatalf("%s health of the leader: %d %v", m, code, h)
				}
				if code, _, _ := probe(t, a.LeaderCheckHandler(), m); code != http.StatusOK {
					t.Fatalf("%s leader check of the leader: %d", m, code)
				}
			}
			if code, _, h := probe(t, a.HealthHandler(), http.MethodPost); code != http.StatusMethodNotAllowed || h.Get("Allow") != "GET, HEAD" {
				t.Fatalf("POST health: %d %v", code, h)
			}
			waitFor(t, time.Second, "the pinned follower to read the lease", func() bool {
				code, _, _ := probe(t, f.HealthHandler(), http.MethodGet)
				return code == http.StatusOK
			})
			if code, body, _ := probe(t, f.LeaderCheckHandler(), http.MethodGet); code != http.StatusServiceUnavailable || body["leader"] != false {
				t.Fatalf("leader check of a follower: %d %v", code, body)
			}

			proxy.Block()
			var body map[string]any
			waitFor(t, 3*time.Second, "the cut-off leader to report unhealthy", func() bool {
				var code int
				code, body, _ = probe(t, a.HealthHandler(), http.MethodGet)
				return code == http.StatusServiceUnavailable
			})
			if r, _ := body["reason"].(string); !strings.HasPrefix(r, "database not reached for") {
				t.Fatalf("unhealthy reason = %q", r)
			}
			if code, _, _ := probe(t, a.LeaderCheckHandler(), http.MethodGet); code != http.StatusServiceUnavailable {
				t.Fatalf("leader check of a cut-off node: %d", code)
			}
			proxy.Unblock()
			waitFor(t, 3*time.Second, "health to come back", func() bool {
				code, _, _ := probe(t, a.HealthHandler(), http.MethodGet)
				return code == http.StatusOK
			})
			a.Shutdown(context.Background())
			if code, body, _ := probe(t, a.HealthHandler(), http.MethodGet); code != http.StatusServiceUnavailable || body["reason"] != "shut down" {
				t.Fatalf("health after Shutdown: %d %v", code, body)
			}
		})
	}
}

// A follower's middleware answers 503 with Retry-After and the leader's
// endpoint; the leader's passes the request on.
func TestRequireLeaderMiddleware(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		a := start(t, tg, "a")
		b := start(t, tg, "b")
		ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
		if code, _, _ := probe(t, a.RequireLeaderMiddleware(ok), http.MethodPost); code != http.StatusCreated {
			t.Fatalf("the leader's middleware answered %d", code)
		}
		waitFor(t, time.Second, "b to learn who leads", func() bool {
			_, _, h := probe(t, b.RequireLeaderMiddleware(ok), http.MethodPost)
			return h.Get("X-Cluster-Leader") != ""
		})
		code, _, h := probe(t, b.RequireLeaderMiddleware(ok), http.MethodPost)
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "1" || h.Get("X-Cluster-Leader") != "http://a.test:8080" {
			t.Fatalf("a follower's middleware: %d %v", code, h)
		}
	})
}

// takesLanes reads the takes_lanes mark of node id's membership row: -1
// when it has none.
func takesLanes(t *testing.T, tg testdb.Target, db *sql.DB, id string) int {
	t.Helper()
	var n int
	err := db.QueryRowContext(context.Background(), bind(tg.Dialect, "SELECT takes_lanes FROM "+tg.Prefix+"nodes WHERE node_id = ?"), id).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// liveMember reports whether c's Members lists node id as live and
// active.
func liveMember(t *testing.T, c *cluster.Cluster, id string) bool {
	t.Helper()
	ms, err := c.Members(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.NodeID == id && m.Live && m.Status == "active" {
			return true
		}
	}
	return false
}

// slowJoins fails the first join at once and makes every later one last
// until its deadline: a database too busy for membership writes.
type slowJoins struct {
	*cluster.DBProvider
	n atomic.Int32
}

func (p *slowJoins) Join(ctx context.Context, scope string, m cluster.Member) error {
	if p.n.Add(1) == 1 {
		return errors.New("join the cluster: context deadline exceeded")
	}
	<-ctx.Done()
	return ctx.Err()
}

// lossyJoins is the default provider whose Join, while lose is above
// zero, records the membership and then reports a failure: the answer of
// a join that committed, lost.
type lossyJoins struct {
	*cluster.DBProvider
	lose atomic.Int32
}

func (p *lossyJoins) Join(ctx context.Context, scope string, m cluster.Member) error {
	if err := p.DBProvider.Join(ctx, scope, m); err != nil {
		return err
	}
	if p.lose.Add(-1) >= 0 {
		return errors.New("lossyJoins: the answer was lost")
	}
	return nil
}

// flakyRenews fails every other Renew with an error that is no answer
// (not a lost lease), as a transaction pooler without the pgx settings it
// needs does, while on is set.
type flakyRenews struct {
	*cluster.DBProvider
	on    atomic.Bool
	calls atomic.Int64
}

func (p *flakyRenews) Renew(ctx context.Context, l provider.Lease, ttl time.Duration) (provider.Lease, error) {
	if p.on.Load() && p.calls.Add(1)%2 == 0 {
		return provider.Lease{}, errors.New("flaky: prepared statement \"stmtcache_1\" already exists")
	}
	return p.DBProvider.Renew(ctx, l, ttl)
}

// Renews that fail and succeed by turns keep the database "reached", and
// the leader keeps its term; health turns 503 once half of the last calls
// failed, naming the rate (not the database's words), and 200 again once
// they succeed.
func TestHealthUnhealthyWhileCallsKeepFailing(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		p, err := cluster.NewDBProvider(tg.Open(t), tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		flaky := &flakyRenews{DBProvider: p}
		a := start(t, tg, "a", func(c *cluster.Config) { c.Provider = flaky })
		waitFor(t, 50*testdb.Heartbeat, "a to lead", a.IsLeader)
		h := a.HealthHandler()
		if code, body, _ := probe(t, h, http.MethodGet); code != http.StatusOK {
			t.Fatalf("health before the failures = %d %v", code, body)
		}
		flaky.on.Store(true)
		waitFor(t, 100*testdb.Heartbeat, "health to turn 503", func() bool {
			code, _, _ := probe(t, h, http.MethodGet)
			return code == http.StatusServiceUnavailable
		})
		code, body, _ := probe(t, h, http.MethodGet)
		reason, _ := body["reason"].(string)
		if code != http.StatusServiceUnavailable || !strings.HasPrefix(reason, "database calls failing: ") || strings.Contains(reason, "stmtcache") {
			t.Fatalf("health while renews fail by turns = %d %v; want 503 naming the failure rate only", code, body)
		}
		if st := a.Stats(); 2*st.RecentFailures < st.RecentCalls || st.LastContact > time.Second {
			t.Fatalf("stats while renews fail by turns: %d of %d failed, last contact %v", st.RecentFailures, st.RecentCalls, st.LastContact)
		}
		flaky.on.Store(false)
		waitFor(t, 100*testdb.Heartbeat, "health to recover", func() bool {
			code, _, _ := probe(t, h, http.MethodGet)
			return code == http.StatusOK
		})
	})
}
