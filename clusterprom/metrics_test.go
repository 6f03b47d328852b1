package clusterprom_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterprom"
	"github.com/sqlfence/cluster/providertest"
)

// The metrics read from Stats on a scrape.
var statsMetrics = []string{
	"sqlfence_cluster_leader",
	"sqlfence_cluster_fencing_token",
	"sqlfence_cluster_term_start_timestamp_seconds",
	"sqlfence_cluster_last_renew_duration_seconds",
	"sqlfence_cluster_consecutive_renew_failures",
	"sqlfence_cluster_last_contact_age_seconds",
	"sqlfence_cluster_acquisitions_total",
	"sqlfence_cluster_losses_total",
	"sqlfence_cluster_resigns_total",
	"sqlfence_cluster_releases_total",
	"sqlfence_cluster_lanes_held",
	"sqlfence_cluster_lane_acquisitions_total",
	"sqlfence_cluster_lane_losses_total",
	"sqlfence_cluster_lane_releases_total",
}

func TestLeader(t *testing.T) {
	a := startNode(t, providertest.NewMemory(nil), "a")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.metrics)
	before := time.Now()
	a.waitRenew(t)

	err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sqlfence_cluster_leader Whether this node leads: 1 while it holds the lease and its trust window is open, 0 otherwise.
# TYPE sqlfence_cluster_leader gauge
sqlfence_cluster_leader{lease="leader",node_id="a"} 1
# HELP sqlfence_cluster_fencing_token Fencing token of the term this node leads in, or 0 when it does not lead.
# TYPE sqlfence_cluster_fencing_token gauge
sqlfence_cluster_fencing_token{lease="leader",node_id="a"} 1
# HELP sqlfence_cluster_acquisitions_total Terms this node began by acquiring the lease.
# TYPE sqlfence_cluster_acquisitions_total counter
sqlfence_cluster_acquisitions_total{lease="leader",node_id="a"} 1
# HELP sqlfence_cluster_losses_total Terms this node lost without releasing the lease, by reason: lease-taken (another term holds the lease) or self-fenced (no renewal succeeded within FenceTimeout).
# TYPE sqlfence_cluster_losses_total counter
sqlfence_cluster_losses_total{lease="leader",node_id="a",reason="lease-taken"} 0
sqlfence_cluster_losses_total{lease="leader",node_id="a",reason="self-fenced"} 0
# HELP sqlfence_cluster_resigns_total Terms this node ended by Resign.
# TYPE sqlfence_cluster_resigns_total counter
sqlfence_cluster_resigns_total{lease="leader",node_id="a"} 0
# HELP sqlfence_cluster_releases_total Leases this node released, in Shutdown or Resign.
# TYPE sqlfence_cluster_releases_total counter
sqlfence_cluster_releases_total{lease="leader",node_id="a"} 0
`), "sqlfence_cluster_leader", "sqlfence_cluster_fencing_token", "sqlfence_cluster_acquisitions_total",
		"sqlfence_cluster_losses_total", "sqlfence_cluster_resigns_total", "sqlfence_cluster_releases_total")
	if err != nil {
		t.Error(err)
	}

	labels := map[string]string{"node_id": "a", "lease": "leader"}
	if n := histogramCount(t, reg, "sqlfence_cluster_renew_duration_seconds", labels); n == 0 {
		t.Error("sqlfence_cluster_renew_duration_seconds: count 0 after a renew")
	}
	if n := histogramCount(t, reg, "sqlfence_cluster_operation_duration_seconds", with(labels, "op", "acquire")); n != 1 {
		t.Errorf("sqlfence_cluster_operation_duration_seconds{op=acquire}: count %d, want 1", n)
	}
	if v := value(t, reg, "sqlfence_cluster_operations_total", with(labels, "op", "acquire", "outcome", "ok")); v != 1 {
		t.Errorf("sqlfence_cluster_operations_total{op=acquire,outcome=ok} = %v, want 1", v)
	}
	if v := value(t, reg, "sqlfence_cluster_operations_total", with(labels, "op", "renew", "outcome", "ok")); v < 1 {
		t.Errorf("sqlfence_cluster_operations_total{op=renew,outcome=ok} = %v, want at least 1", v)
	}
	if v := value(t, reg, "sqlfence_cluster_consecutive_renew_failures", labels); v != 0 {
		t.Errorf("sqlfence_cluster_consecutive_renew_failures = %v, want 0", v)
	}
	if v := value(t, reg, "sqlfence_cluster_last_renew_duration_seconds", labels); v <= 0 || v > fenceTimeout.Seconds() {
		t.Errorf("sqlfence_cluster_last_renew_duration_seconds = %v, want within (0, %v]", v, fenceTimeout.Seconds())
	}
	if v := value(t, reg, "sqlfence_cluster_last_contact_age_seconds", labels); v < 0 || v > waitTimeout.Seconds() {
		t.Errorf("sqlfence_cluster_last_contact_age_seconds = %v, want within [0, %v]", v, waitTimeout.Seconds())
	}
	// The term began in startNode, before the renew we waited for. A
	// float64 of Unix seconds keeps about a quarter of a microsecond.
	start := value(t, reg, "sqlfence_cluster_term_start_timestamp_seconds", labels)
	if got := time.Unix(0, int64(start*1e9)); got.After(before.Add(time.Millisecond)) || before.Sub(got) > waitTimeout {
		t.Errorf("sqlfence_cluster_term_start_timestamp_seconds = %v (%v), want shortly before %v", start, got, before)
	}
	lint(t, reg)

	if err := a.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := value(t, reg, "sqlfence_cluster_leader", labels); v != 0 {
		t.Errorf("after Shutdown: sqlfence_cluster_leader = %v, want 0", v)
	}
	if v := value(t, reg, "sqlfence_cluster_fencing_token", labels); v != 0 {
		t.Errorf("after Shutdown: sqlfence_cluster_fencing_token = %v, want 0", v)
	}
	if v := value(t, reg, "sqlfence_cluster_releases_total", labels); v != 1 {
		t.Errorf("after Shutdown: sqlfence_cluster_releases_total = %v, want 1", v)
	}
	if v := value(t, reg, "sqlfence_cluster_operations_total", with(labels, "op", "release", "outcome", "ok")); v != 1 {
		t.Errorf("after Shutdown: sqlfence_cluster_operations_total{op=release,outcome=ok} = %v, want 1", v)
	}
	if n, err := testutil.GatherAndCount(reg, "sqlfence_cluster_term_start_timestamp_seconds"); err != nil || n != 0 {
		t.Errorf("after Shutdown: %d sqlfence_cluster_term_start_timestamp_seconds (%v), want none", n, err)
	}
	lint(t, reg)
}

// Two Clusters of one process, each with its Metrics in one registry: the
// follower reports the lease held, and a leader cut off from the store
// reports its term self-fenced once the other node took over.
func TestTwoNodes(t *testing.T) {
	store := providertest.NewMemory(nil)
	a := startNode(t, store, "a")
	b := startNode(t, store, "b")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.metrics, b.metrics)
	la := map[string]string{"node_id": "a", "lease": "leader"}
	lb := map[string]string{"node_id": "b", "lease": "leader"}

	if v := value(t, reg, "sqlfence_cluster_leader", la); v != 1 {
		t.Errorf("a: sqlfence_cluster_leader = %v, want 1", v)
	}
	if v := value(t, reg, "sqlfence_cluster_leader", lb); v != 0 {
		t.Errorf("b: sqlfence_cluster_leader = %v, want 0", v)
	}
	if v := value(t, reg, "sqlfence_cluster_operations_total", with(lb, "op", "acquire", "outcome", "held")); v < 1 {
		t.Errorf("b: sqlfence_cluster_operations_total{op=acquire,outcome=held} = %v, want at least 1", v)
	}

	store.Disconnect("a")
	store.Expire("leader")
	if e := a.waitEvent(t, cluster.EventLeaseLost); e.Reason != cluster.ReasonSelfFenced {
		t.Fatalf("a: lease-lost with reason %q, want %q", e.Reason, cluster.ReasonSelfFenced)
	}
	b.waitEvent(t, cluster.EventLeaseAcquired)

	if v := value(t, reg, "sqlfence_cluster_losses_total", with(la, "reason", "self-fenced")); v != 1 {
		t.Errorf("a: sqlfence_cluster_losses_total{reason=self-fenced} = %v, want 1", v)
	}
	if v := value(t, reg, "sqlfence_cluster_losses_total", with(la, "reason", "lease-taken")); v != 0 {
		t.Errorf("a: sqlfence_cluster_losses_total{reason=lease-taken} = %v, want 0", v)
	}
	if v := value(t, reg, "sqlfence_cluster_operations_total", with(la, "op", "renew", "outcome", "error")); v < 1 {
		t.Errorf("a: sqlfence_cluster_operations_total{op=renew,outcome=error} = %v, want at least 1", v)
	}
	if v := value(t, reg, "sqlfence_cluster_leader", la); v != 0 {
		t.Errorf("a: sqlfence_cluster_leader = %v, want 0", v)
	}
	if v := value(t, reg, "sqlfence_cluster_leader", lb); v != 1 {
		t.Errorf("b: sqlfence_cluster_leader = %v, want 1", v)
	}
	if v := value(t, reg, "sqlfence_cluster_fencing_token", lb); v != 2 {
		t.Errorf("b: sqlfence_cluster_fencing_token = %v, want 2", v)
	}
	lint(t, reg)

	// a campaigns while cut off, so its Shutdown releases whatever an
	// attempt whose answer it lost may have acquired: let it reach the
	// store again.
	store.Reconnect("a")
}

// Before Watch, a Metrics reports only what Observe feeds it, every
// operation and outcome at 0.
func TestNotWatched(t *testing.T) {
	m := clusterprom.New(cluster.Config{NodeID: "a", LeaseName: "jobs"})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	if n, err := testutil.GatherAndCount(reg, statsMetrics...); err != nil || n != 0 {
		t.Errorf("before Watch: %d metrics read from Stats (%v), want none", n, err)
	}
	// acquire: ok, held, error; renew: ok, lost, error; release: ok,
	// error; fence: ok, stale, error; claim-lane: ok, held, limit, error;
	// renew-lanes: ok, error; release-lane: ok, error.
	if n, err := testutil.GatherAndCount(reg, "sqlfence_cluster_operations_total"); err != nil || n != 19 {
		t.Errorf("before any call: %d sqlfence_cluster_operations_total series (%v), want 19", n, err)
	}
	m.Observe(cluster.Operation{Kind: cluster.OpFence, Outcome: cluster.OutcomeStale, Duration: 3 * time.Millisecond})
	labels := map[string]string{"node_id": "a", "lease": "jobs"}
	if v := value(t, reg, "sqlfence_cluster_operations_total", with(labels, "op", "fence", "outcome", "stale")); v != 1 {
		t.Errorf("sqlfence_cluster_operations_total{op=fence,outcome=stale} = %v, want 1", v)
	}
	if n := histogramCount(t, reg, "sqlfence_cluster_operation_duration_seconds", with(labels, "op", "fence")); n != 1 {
		t.Errorf("sqlfence_cluster_operation_duration_seconds{op=fence}: count %d, want 1", n)
	}
	if n := histogramCount(t, reg, "sqlfence_cluster_renew_duration_seconds", labels); n != 0 {
		t.Errorf("sqlfence_cluster_renew_duration_seconds: count %d, want 0", n)
	}
	lint(t, reg)
}

func TestWatchOtherNode(t *testing.T) {
	a := startNode(t, providertest.NewMemory(nil), "a")
	m := clusterprom.New(cluster.Config{NodeID: "b"})
	defer func() {
		if recover() == nil {
			t.Error("Watch of node a by the Metrics of node b did not panic")
		}
	}()
	m.Watch(a.Cluster)
}

// lint fails t if promlint finds a problem in what reg gathers.
func lint(t *testing.T, reg prometheus.Gatherer) {
	t.Helper()
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// with returns a copy of labels with the given name, value pairs added.
func with(labels map[string]string, pairs ...string) map[string]string {
	l := make(map[string]string, len(labels)+len(pairs)/2)
	for k, v := range labels {
		l[k] = v
	}
	for i := 0; i+1 < len(pairs); i += 2 {
		l[pairs[i]] = pairs[i+1]
	}
	return l
}

// metric returns the one metric named name with exactly labels, failing t
// if reg gathers none.
func metric(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue next
				}
			}
			return m
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return nil
}

// value returns the value of a gauge or counter.
func value(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	m := metric(t, reg, name, labels)
	if m.GetGauge() != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}

// histogramCount returns the number of observations of a histogram.
func histogramCount(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	return metric(t, reg, name, labels).GetHistogram().GetSampleCount()
}

// A node's lanes: the claims it makes and their outcomes, the lanes it
// holds, and those it loses and releases.
func TestLanes(t *testing.T) {
	store := providertest.NewMemory(nil)
	a := startNode(t, store, "a")
	b := startNode(t, store, "b")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.metrics, b.metrics)
	la := map[string]string{"node_id": "a", "lease": "leader"}
	lb := map[string]string{"node_id": "b", "lease": "leader"}
	ctx := t.Context()

	// a claims and works alone first: b takes no lane, so it does not
	// count in the fair share, and a keeps both lanes.
	for _, k := range []string{"k1", "k2"} {
		if _, err := a.ClaimLane(ctx, providertest.NoTx, k); err != nil {
			t.Fatal(err)
		}
	}
	if v := value(t, reg, "sqlfence_cluster_lanes_held", la); v != 2 {
		t.Errorf("a: sqlfence_cluster_lanes_held = %v, want 2", v)
	}
	if v := value(t, reg, "sqlfence_cluster_operations_total", with(la, "op", "claim-lane", "outcome", "ok")); v != 2 {
		t.Errorf("a: sqlfence_cluster_operations_total{op=claim-lane,outcome=ok} = %v, want 2", v)
	}

	store.ExpireLane("leader", "k2")
	a.waitEvent(t, cluster.EventLaneLost)
	if err := a.ReleaseLane(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if v := value(t, reg, "sqlfence_cluster_lanes_held", la); v != 0 {
		t.Errorf("a: sqlfence_cluster_lanes_held = %v, want 0", v)
	}
	for name, want := range map[string]float64{
		"sqlfence_cluster_lane_acquisitions_total": 2,
		"sqlfence_cluster_lane_losses_total":       1,
		"sqlfence_cluster_lane_releases_total":     1,
	} {
		if v := value(t, reg, name, la); v != want {
			t.Errorf("a: %s = %v, want %v", name, v, want)
		}
	}
	if v := value(t, reg, "sqlfence_cluster_operations_total", with(la, "op", "renew-lanes", "outcome", "ok")); v < 1 {
		t.Errorf("a: sqlfence_cluster_operations_total{op=renew-lanes,outcome=ok} = %v, want at least 1", v)
	}
	if n := histogramCount(t, reg, "sqlfence_cluster_operation_duration_seconds", with(la, "op", "release-lane")); n != 1 {
		t.Errorf("a: sqlfence_cluster_operation_duration_seconds{op=release-lane}: count %d, want 1", n)
	}

	// b's claim of a lane a holds is refused, and counted as held.
	if _, err := a.ClaimLane(ctx, providertest.NoTx, "k3"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ClaimLane(ctx, providertest.NoTx, "k3"); !errors.Is(err, cluster.ErrLaneHeld) {
		t.Fatalf("b's claim of a's lane = %v", err)
	}
	if v := value(t, reg, "sqlfence_cluster_operations_total", with(lb, "op", "claim-lane", "outcome", "held")); v != 1 {
		t.Errorf("b: sqlfence_cluster_operations_total{op=claim-lane,outcome=held} = %v, want 1", v)
	}
	lint(t, reg)
}

// Register wires a Cluster made without an Observer: its renewals are
// counted from then on, its Stats read on every scrape; the default
// instance's too, after Init.
func TestRegister(t *testing.T) {
	store := providertest.NewMemory(nil)
	a := startNode(t, store, "a")
	reg := prometheus.NewPedanticRegistry()
	if _, err := clusterprom.Register(reg, a.Cluster); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"node_id": "a", "lease": cluster.DefaultLeaseName}
	deadline := time.Now().Add(5 * time.Second)
	for value(t, reg, "sqlfence_cluster_operations_total", with(labels, "op", "renew", "outcome", "ok")) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no renewal counted within 5s of Register")
		}
		time.Sleep(heartbeatInterval)
	}
	if v := value(t, reg, "sqlfence_cluster_leader", labels); v != 1 {
		t.Errorf("sqlfence_cluster_leader = %v, want 1", v)
	}
	if _, err := clusterprom.Register(reg, a.Cluster); err == nil {
		t.Error("a second Register of the same node and lease succeeded")
	}
	lint(t, reg)

	// The default instance, after Init.
	ctx := context.Background()
	if err := cluster.Init(ctx, cluster.Config{NodeID: "d", LeaseName: "jobs", Provider: providertest.NewMemory(nil),
		LeaseTTL: leaseTTL, HeartbeatInterval: heartbeatInterval, FenceTimeout: fenceTimeout}); err != nil {
		t.Fatal(err)
	}
	defer cluster.Shutdown(ctx)
	dreg := prometheus.NewPedanticRegistry()
	if _, err := clusterprom.Register(dreg, cluster.Default()); err != nil {
		t.Fatal(err)
	}
	dl := map[string]string{"node_id": "d", "lease": "jobs"}
	deadline = time.Now().Add(5 * time.Second)
	for value(t, dreg, "sqlfence_cluster_operations_total", with(dl, "op", "renew", "outcome", "ok")) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no renewal of the default instance counted within 5s of Register")
		}
		time.Sleep(heartbeatInterval)
	}
	if v := value(t, dreg, "sqlfence_cluster_leader", dl); v != 1 {
		t.Errorf("the default instance's sqlfence_cluster_leader = %v, want 1", v)
	}
}
