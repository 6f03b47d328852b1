package clusterprom_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterprom"
	"github.com/sqlfence/cluster/providertest"
)

// A node's metrics in a registry of their own. A real node would serve the
// registry with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), or
// register m with prometheus.MustRegister; this one prints part of a scrape.
func Example() {
	ctx := context.Background()
	cfg := cluster.Config{
		NodeID:            "node-1",
		LeaseName:         "jobs",
		Provider:          providertest.NewMemory(nil), // DB: db in production
		LeaseTTL:          time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		FenceTimeout:      700 * time.Millisecond,
	}
	m := clusterprom.New(cfg) // labels node_id="node-1", lease="jobs"
	cfg.Observer = m.Observe
	c, err := cluster.New(ctx, cfg) // a lone node leads when New returns
	if err != nil {
		log.Fatal(err)
	}
	defer c.Shutdown(ctx)
	m.Watch(c)

	reg := prometheus.NewRegistry()
	reg.MustRegister(m)

	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	enc := expfmt.NewEncoder(os.Stdout, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if slices.Contains([]string{"sqlfence_cluster_leader", "sqlfence_cluster_fencing_token", "sqlfence_cluster_acquisitions_total"}, f.GetName()) {
			if err := enc.Encode(f); err != nil {
				log.Fatal(err)
			}
		}
	}
	// Output:
	// # HELP sqlfence_cluster_acquisitions_total Terms this node began by acquiring the lease.
	// # TYPE sqlfence_cluster_acquisitions_total counter
	// sqlfence_cluster_acquisitions_total{lease="jobs",node_id="node-1"} 1
	// # HELP sqlfence_cluster_fencing_token Fencing token of the term this node leads in, or 0 when it does not lead.
	// # TYPE sqlfence_cluster_fencing_token gauge
	// sqlfence_cluster_fencing_token{lease="jobs",node_id="node-1"} 1
	// # HELP sqlfence_cluster_leader Whether this node leads: 1 while it holds the lease and its trust window is open, 0 otherwise.
	// # TYPE sqlfence_cluster_leader gauge
	// sqlfence_cluster_leader{lease="jobs",node_id="node-1"} 1
}

// Register wires a running node's metrics in one call.
func ExampleRegister() {
	ctx := context.Background()
	c, err := cluster.New(ctx, cluster.Config{
		NodeID:            "node-1",
		Provider:          providertest.NewMemory(nil), // DB: db in production
		LeaseTTL:          time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		FenceTimeout:      700 * time.Millisecond,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Shutdown(ctx)
	reg := prometheus.NewRegistry() // prometheus.DefaultRegisterer in a service
	if _, err := clusterprom.Register(reg, c); err != nil {
		log.Fatal(err)
	}
	if _, err := clusterprom.Register(reg, c); err != nil {
		fmt.Println("twice:", err != nil)
	}
	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	enc := expfmt.NewEncoder(os.Stdout, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if f.GetName() == "sqlfence_cluster_leader" {
			if err := enc.Encode(f); err != nil {
				log.Fatal(err)
			}
		}
	}
	// Output:
	// twice: true
	// # HELP sqlfence_cluster_leader Whether this node leads: 1 while it holds the lease and its trust window is open, 0 otherwise.
	// # TYPE sqlfence_cluster_leader gauge
	// sqlfence_cluster_leader{lease="leader",node_id="node-1"} 1
}
