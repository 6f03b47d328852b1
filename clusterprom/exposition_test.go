package clusterprom_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sqlfence/cluster/providertest"
)

// envExposition names the environment variable that tells
// TestExposition where to write its scrape, for promtool check metrics in
// CI. Without it, the scrape goes to a temporary file.
const envExposition = "CLUSTERPROM_EXPOSITION"

// TestExposition writes a scrape of a leader and a follower, in the text
// exposition format Prometheus reads, after a renew of the leader, so that
// every metric is in it, and checks that the file parses.
func TestExposition(t *testing.T) {
	store := providertest.NewMemory(nil)
	a := startNode(t, store, "a")
	b := startNode(t, store, "b")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.metrics, b.metrics)
	a.waitRenew(t)
	lint(t, reg)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	path := os.Getenv(envExposition)
	if path == "" {
		path = filepath.Join(t.TempDir(), "metrics.prom")
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d metric families to %s", len(families), path)

	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("the scrape does not parse: %v", err)
	}
	if n := len(statsMetrics) + 3; len(parsed) != n {
		t.Errorf("the scrape has %d metric families, want %d", len(parsed), n)
	}
}
