package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// syncBuffer is a bytes.Buffer safe for the node's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A node's own records under slog's JSON handler: one JSON object per
// line, its timings as text, and no null attribute.
func TestJSONLogsReadable(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.SQLite)
	var buf syncBuffer
	a := start(t, tg, "a", func(c *cluster.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	waitFor(t, 10*testdb.Heartbeat, "a to lead", a.IsLeader)
	if err := a.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	started := false
	sc := bufio.NewScanner(bytes.NewReader([]byte(buf.String())))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("a log line is not one JSON record: %v: %q", err, sc.Text())
		}
		for k, v := range rec {
			if v == nil {
				t.Errorf("record %q has %q: null", rec["msg"], k)
			}
		}
		if rec["msg"] == "cluster: node started" {
			started = true
			for _, k := range []string{"lease_ttl", "heartbeat_interval", "fence_timeout"} {
				if _, ok := rec[k].(string); !ok {
					t.Errorf("node started: %s = %v (%T), want text such as \"1s\"", k, rec[k], rec[k])
				}
			}
		}
	}
	if !started {
		t.Fatalf("no \"node started\" record in %q", buf.String())
	}
}
