package clusterprom

import (
	"cmp"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sqlfence/cluster"
)

// namespace and subsystem prefix every metric: sqlfence_cluster_.
const (
	namespace = "sqlfence"
	subsystem = "cluster"
)

// durationBuckets are the histograms' upper bounds in seconds: from half a
// millisecond, a renew on a local database, to 30s, beyond the default
// FenceTimeout (20s).
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Metrics is a [prometheus.Collector] for one node: it counts the node's
// provider calls passed to [Metrics.Observe] and, on every scrape, reads
// the [cluster.Stats] of the Cluster passed to [Metrics.Watch]. Its methods
// are safe for concurrent use. Create it with [New].
type Metrics struct {
	nodeID string
	c      atomic.Pointer[cluster.Cluster]

	ops        *prometheus.CounterVec // op, outcome
	renew      prometheus.Histogram
	opDuration *prometheus.HistogramVec // op: acquire, release, fence

	leader, fencingToken, termStart, lastRenew, renewFailures, lastContact *prometheus.Desc
	acquisitions, losses, resigns, releases                                *prometheus.Desc
	lanesHeld, laneAcquisitions, laneLosses, laneReleases                  *prometheus.Desc
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns the Metrics of the node that cfg configures. Only cfg's
// NodeID and LeaseName are read, for the constant labels node_id and lease
// of every metric; an empty LeaseName is [cluster.DefaultLeaseName], as in
// [cluster.New]. New does not change cfg: set cfg.Observer = m.Observe
// yourself (wrapping an Observer of your own if you have one), create the
// Cluster from cfg, and [Metrics.Watch] it.
func New(cfg cluster.Config) *Metrics {
	labels := prometheus.Labels{
		"node_id": cfg.NodeID,
		"lease":   cmp.Or(cfg.LeaseName, cluster.DefaultLeaseName),
	}
	desc := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, name), help, variable, labels)
	}
	m := &Metrics{
		nodeID: cfg.NodeID,
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, ConstLabels: labels,
			Name: "operations_total",
			Help: "Provider calls this node made, by kind (acquire, renew, release, fence, claim-lane, renew-lanes, release-lane) and outcome (ok, held, lost, stale, limit, error).",
		}, []string{"op", "outcome"}),
		renew: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, ConstLabels: labels,
			Name:    "renew_duration_seconds",
			Help:    "How long this node's lease renewals took, whatever their outcome.",
			Buckets: durationBuckets,
		}),
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, ConstLabels: labels,
			Name:    "operation_duration_seconds",
			Help:    "How long this node's provider calls other than lease renewals took (acquire, release, fence, claim-lane, renew-lanes, release-lane), by kind, whatever their outcome; lease renewals are in sqlfence_cluster_renew_duration_seconds.",
			Buckets: durationBuckets,
		}, []string{"op"}),

		leader:        desc("leader", "Whether this node leads: 1 while it holds the lease and its trust window is open, 0 otherwise."),
		fencingToken:  desc("fencing_token", "Fencing token of the term this node leads in, or 0 when it does not lead."),
		termStart:     desc("term_start_timestamp_seconds", "Unix time at which this node's current term began, by its own clock; absent when it does not lead."),
		lastRenew:     desc("last_renew_duration_seconds", "How long this node's last successful lease renewal took; absent before the first."),
		renewFailures: desc("consecutive_renew_failures", "Failed lease renewals of this node's current term since its last successful one."),
		lastContact:   desc("last_contact_age_seconds", "Time since the database last answered a lease statement of this node, by the node's monotonic clock; absent before the first answer."),
		acquisitions:  desc("acquisitions_total", "Terms this node began by acquiring the lease."),
		losses:        desc("losses_total", "Terms this node lost without releasing the lease, by reason: lease-taken (another term holds the lease) or self-fenced (no renewal succeeded within FenceTimeout).", "reason"),
		resigns:       desc("resigns_total", "Terms this node ended by Resign."),
		releases:      desc("releases_total", "Leases this node released, in Shutdown or Resign."),

		lanesHeld:        desc("lanes_held", "Lanes this node believes it owns now."),
		laneAcquisitions: desc("lane_acquisitions_total", "Claims on lanes this node began (lane-acquired events)."),
		laneLosses:       desc("lane_losses_total", "Lanes this node lost without releasing them (lane-lost events)."),
		laneReleases:     desc("lane_releases_total", "Lanes this node released, handed over, or released in Shutdown (lane-released events)."),
	}
	// The calls a Cluster makes and the outcomes each can have start at 0,
	// so that a rate over them exists before the first of them happens.
	for op, outcomes := range map[cluster.OpKind][]cluster.Outcome{
		cluster.OpAcquire: {cluster.OutcomeOK, cluster.OutcomeHeld, cluster.OutcomeError},
		cluster.OpRenew:   {cluster.OutcomeOK, cluster.OutcomeLost, cluster.OutcomeError},
		cluster.OpRelease: {cluster.OutcomeOK, cluster.OutcomeError},
		cluster.OpFence:   {cluster.OutcomeOK, cluster.OutcomeStale, cluster.OutcomeError},

		cluster.OpClaimLane:   {cluster.OutcomeOK, cluster.OutcomeHeld, cluster.OutcomeLimit, cluster.OutcomeError},
		cluster.OpRenewLanes:  {cluster.OutcomeOK, cluster.OutcomeError},
		cluster.OpReleaseLane: {cluster.OutcomeOK, cluster.OutcomeError},
	} {
		for _, o := range outcomes {
			m.ops.WithLabelValues(string(op), string(o))
		}
	}
	return m
}

// Register exports the metrics of c to reg in one call, after [cluster.New]
// or [cluster.Init] (with cluster.Default()): it makes c's Metrics, with
// the labels node_id and lease of c, has c report every provider call it
// makes from now on to them ([cluster.Cluster.Observe]), has every scrape
// read c's Stats ([Metrics.Watch]), and registers them with reg. It
// returns the registry's error, such as a duplicate registration of the
// same node and lease, and then changes nothing. Calls made before
// Register are not counted; to count New's first acquisition too, wire the
// Metrics by hand: see [New].
func Register(reg prometheus.Registerer, c *cluster.Cluster) (*Metrics, error) {
	m := New(cluster.Config{NodeID: c.NodeID(), LeaseName: c.LeaseName()})
	m.Watch(c)
	if err := reg.Register(m); err != nil {
		return nil, err
	}
	c.Observe(m.Observe)
	return m, nil
}

// Observe records op: it counts it by kind and outcome and records its
// latency. Set it as [cluster.Config.Observer]. It returns at once, as an
// Observer must: it runs on the goroutine that made the call, the
// heartbeat's among them, and only reads a map of the label values it has
// seen before incrementing atomically.
func (m *Metrics) Observe(op cluster.Operation) {
	m.ops.WithLabelValues(string(op.Kind), string(op.Outcome)).Inc()
	if op.Kind == cluster.OpRenew {
		m.renew.Observe(op.Duration.Seconds())
	} else {
		m.opDuration.WithLabelValues(string(op.Kind)).Observe(op.Duration.Seconds())
	}
}

// Watch makes every later scrape read c.Stats. c must be the Cluster made
// from the Config given to [New]: Watch panics if c's NodeID is not that
// Config's. A later Watch replaces c, for a process that creates a new
// Cluster after shutting down the old one; the Stats counters then start
// again from 0, which Prometheus reads as a counter reset. Until the first
// Watch, Collect reports only the metrics fed by Observe.
func (m *Metrics) Watch(c *cluster.Cluster) {
	if c.NodeID() != m.nodeID {
		panic(fmt.Sprintf("clusterprom: Watch of node %q by the Metrics of node %q", c.NodeID(), m.nodeID))
	}
	m.c.Store(c)
}

// Describe sends the descriptors of every metric m can collect. It
// implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.ops.Describe(ch)
	m.renew.Describe(ch)
	m.opDuration.Describe(ch)
	for _, d := range []*prometheus.Desc{
		m.leader, m.fencingToken, m.termStart, m.lastRenew, m.renewFailures, m.lastContact,
		m.acquisitions, m.losses, m.resigns, m.releases,
		m.lanesHeld, m.laneAcquisitions, m.laneLosses, m.laneReleases,
	} {
		ch <- d
	}
}

// Collect sends the metrics fed by Observe and, once a Cluster is watched,
// those read from one call of its Stats. It implements
// [prometheus.Collector].
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.ops.Collect(ch)
	m.renew.Collect(ch)
	m.opDuration.Collect(ch)
	c := m.c.Load()
	if c == nil {
		return
	}
	s := c.Stats()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(m.leader, boolFloat(s.Leader))
	gauge(m.fencingToken, float64(s.FencingToken))
	if s.Leader && !s.TermStart.IsZero() {
		gauge(m.termStart, float64(s.TermStart.UnixNano())/float64(time.Second))
	}
	if s.LastRenewLatency > 0 {
		gauge(m.lastRenew, s.LastRenewLatency.Seconds())
	}
	gauge(m.renewFailures, float64(s.ConsecutiveRenewFailures))
	if s.LastContact >= 0 {
		gauge(m.lastContact, s.LastContact.Seconds())
	}
	counter(m.acquisitions, s.Acquisitions)
	counter(m.losses, s.LossesTaken, string(cluster.ReasonLeaseTaken))
	counter(m.losses, s.SelfFences, string(cluster.ReasonSelfFenced))
	counter(m.resigns, s.Resigns)
	counter(m.releases, s.Releases)
	gauge(m.lanesHeld, float64(s.LanesHeld))
	counter(m.laneAcquisitions, s.LaneAcquisitions)
	counter(m.laneLosses, s.LaneLosses)
	counter(m.laneReleases, s.LaneReleases)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
