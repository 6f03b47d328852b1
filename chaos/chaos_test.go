package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// TestMain runs a node instead of the tests when the harness re-executes
// the test binary as one.
func TestMain(m *testing.M) {
	if raw := os.Getenv(envNode); raw != "" {
		os.Exit(nodeMain(raw))
	}
	os.Exit(m.Run())
}

// testTimings are the cluster timings of every test experiment.
var testTimings = timings{TTL: 2 * time.Second, Heartbeat: 400 * time.Millisecond, FenceTimeout: 1500 * time.Millisecond}

// dialects returns the dialects to test with their DSNs: SQLite always,
// PostgreSQL and MySQL when CLUSTER_TEST_POSTGRES_DSN and
// CLUSTER_TEST_MYSQL_DSN name them (a missing one fails the test under
// CLUSTER_TEST_REQUIRE_ALL). With -short, SQLite only.
func dialects(t *testing.T) map[cluster.Dialect]string {
	out := map[cluster.Dialect]string{cluster.SQLite: ""}
	if testing.Short() {
		return out
	}
	for d, env := range map[cluster.Dialect]string{cluster.Postgres: "CLUSTER_TEST_POSTGRES_DSN", cluster.MySQL: "CLUSTER_TEST_MYSQL_DSN"} {
		switch v := os.Getenv(env); {
		case v != "":
			out[d] = v
		case os.Getenv("CLUSTER_TEST_REQUIRE_ALL") != "":
			t.Fatalf("%s is not set and CLUSTER_TEST_REQUIRE_ALL requires every dialect", env)
		default:
			t.Logf("%s is not set: skipping %s", env, d)
		}
	}
	return out
}

func runExperiment(t *testing.T, e *experiment) *result {
	t.Helper()
	e.Dir = t.TempDir()
	e.Log = testLog{t}
	ctx, cancel := context.WithTimeout(context.Background(), e.Duration+2*time.Minute)
	defer cancel()
	res, err := e.run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	report(&b, res)
	t.Logf("%s", b.String())
	return res
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestExperiment runs a short seeded experiment on each dialect, with
// every fault kind the dialect takes; the checker must find nothing.
func TestExperiment(t *testing.T) {
	for d, dsn := range dialects(t) {
		t.Run(string(d), func(t *testing.T) {
			res := runExperiment(t, &experiment{Dialect: d, DSN: dsn, Seed: 7, Duration: 15 * time.Second, Nodes: 3,
				Timings: testTimings, Pause: 20 * time.Millisecond, StaleWrites: 2, Lanes: 4, LeaderShare: 0.75})
			for _, a := range res.Anomalies {
				t.Errorf("%s: %s", a.Kind, a.Detail)
			}
			if len(res.FaultList) == 0 {
				t.Error("no fault was injected")
			}
		})
	}
}

// TestExperimentPgx runs the experiment on PostgreSQL through clusterpgx:
// followers LISTEN, a release names its successor, which attempts on its
// listening connection, and fenced writes begin with BeginFencedSQL. The
// nemesis also makes leaders resign, so handoffs happen after resets and
// killed sessions (which kill listeners too). Besides finding no anomaly
// (never-heard among them), every node must have heard releases, and a
// resign's handoff must take well under a poll (a heartbeat): handoffs
// that waited for polls would show a median near half a heartbeat or
// more.
func TestExperimentPgx(t *testing.T) {
	dsn := dialects(t)[cluster.Postgres]
	if dsn == "" {
		t.Skip("needs PostgreSQL (CLUSTER_TEST_POSTGRES_DSN)")
	}
	// Seed 50 of these kinds: a partition of the leader and a follower's
	// sessions killed (its listener too), then three resigns of the leader.
	res := runExperiment(t, &experiment{Dialect: cluster.Postgres, Stack: stackPgx, DSN: dsn, Seed: 50, Duration: 20 * time.Second, Nodes: 3,
		Timings: testTimings, Pause: 20 * time.Millisecond, StaleWrites: 2, Lanes: 4, LeaderShare: 0.75,
		Kinds: []string{faultReset, faultDBKill, faultPartition, faultResign}})
	for _, a := range res.Anomalies {
		t.Errorf("%s: %s", a.Kind, a.Detail)
	}
	if res.Hearing < 3 {
		t.Errorf("%d processes heard releases (Stats.HearingReleases); want each of the 3 nodes", res.Hearing)
	}
	if len(res.Handoffs) < 2 {
		t.Fatalf("%d resign handoffs measured among %d resigns; want at least 2", len(res.Handoffs), res.Faults[faultResign])
	}
	h := slices.Clone(res.Handoffs)
	slices.Sort(h)
	if p50 := h[len(h)/2]; p50 > testTimings.Heartbeat/4 {
		t.Errorf("resign handoff p50 %v over %d handoffs (%v): above a quarter of the %v heartbeat, as if followers polled", p50, len(h), h, testTimings.Heartbeat)
	}
}

// TestMutants runs each mutant: a harness that finds no anomaly of the
// kind the mutant causes is broken. Faults aim at the leader, so that
// terms end within the short run.
func TestMutants(t *testing.T) {
	want := map[string][]string{
		mutantSkipFence: {aTokenRegression, aLinearizability},
		mutantTipGuard:  {aTokenRegression, aLinearizability},
		mutantLongTrust: {aOverlap},
		mutantSteal:     {aOverlap},
	}
	for d, dsn := range dialects(t) {
		kinds := []string{faultPause}
		if d != cluster.SQLite {
			kinds = []string{faultPause, faultPartition}
		}
		for _, m := range []string{mutantSkipFence, mutantTipGuard, mutantLongTrust, mutantSteal} {
			t.Run(string(d)+"/"+m, func(t *testing.T) {
				// The faults aim at the leader, except for steal's, which aim
				// at random nodes: a steal (every 3 TTLs, by a follower) shows
				// only beside a leader that still believes it leads, and with
				// seed 3 SQLite's two leader pauses covered the steals at 6s
				// and 12s, so the mutant escaped in some runs (CI, 2026-12-02).
				share := 1.0
				if m == mutantSteal {
					share = 0
				}
				res := runExperiment(t, &experiment{Dialect: d, DSN: dsn, Seed: 3, Duration: 15 * time.Second, Nodes: 3,
					Timings: testTimings, Pause: 20 * time.Millisecond, StaleWrites: 2, Lanes: 4, Mutant: m, Kinds: kinds, LeaderShare: share})
				caught := 0
				for _, a := range res.Anomalies {
					for _, k := range want[m] {
						if a.Kind == k {
							caught++
						}
					}
				}
				if caught == 0 {
					t.Errorf("mutant %s passed: no anomaly of kind %v among %d", m, want[m], len(res.Anomalies))
				}
			})
		}
	}
}

// TestFailover runs the failover experiment: a PostgreSQL primary and an
// asynchronous standby of the harness's own, the standby promoted after it
// missed the last grants and commits. Every node whose witness file saw
// more than the promoted database must refuse to lead there. It needs the
// PostgreSQL server programs (and, as root, a postgres account to run
// them); without them it skips, or fails under CLUSTER_TEST_REQUIRE_ALL.
func TestFailover(t *testing.T) {
	_, err := findPGBin("")
	if err == nil {
		_, err = serverUser()
	}
	if err != nil {
		if os.Getenv("CLUSTER_TEST_REQUIRE_ALL") != "" {
			t.Fatalf("%v, and CLUSTER_TEST_REQUIRE_ALL requires the failover experiment", err)
		}
		t.Skip(err)
	}
	e := &failoverExperiment{Seed: 1, Nodes: 3, Timings: testTimings, Pause: 20 * time.Millisecond, Handovers: 2,
		Dir: t.TempDir(), Log: testLog{t}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := e.run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	reportFailover(&b, res)
	t.Logf("%s", b.String())
	for _, a := range res.Anomalies {
		t.Errorf("%s: %s", a.Kind, a.Detail)
	}
}
