package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The trials of two runs are pooled by system; files of different kinds
// of trial are refused.
func TestPoolFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r trialsResult) string {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	a := write("a.json", trialsResult{Kind: handoff, Systems: []systemTrials{
		{System: "pgx", Trials: []trial{{Ms: 1}, {Ms: 2}}},
		{System: "etcd", Trials: []trial{{Ms: 3}}},
	}})
	b := write("b.json", trialsResult{Kind: handoff, Systems: []systemTrials{
		{System: "pgx", Trials: []trial{{Ms: 4}}},
	}})
	p, err := poolFiles([]string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(p.systems, ","); got != "etcd,pgx" {
		t.Fatalf("systems %s; want etcd,pgx", got)
	}
	if s := summarize(p.trials["pgx"]); s.N != 3 || s.Max != 4 || p.runs["pgx"] != 2 {
		t.Fatalf("pgx pooled %d trials of %d runs, max %v; want 3 of 2, max 4", s.N, p.runs["pgx"], s.Max)
	}
	c := write("c.json", trialsResult{Kind: takeover})
	if _, err := poolFiles([]string{a, c}); err == nil || !strings.Contains(err.Error(), "takeover") {
		t.Fatalf("pooling handoff and takeover files: %v; want an error naming both kinds", err)
	}
}
