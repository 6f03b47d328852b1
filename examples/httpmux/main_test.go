package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

func TestService(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "orders.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate") // as main.go opens it
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := &service{db: db}
	if err := s.migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Init(ctx, cluster.Config{NodeID: "node-1", DB: db, Endpoint: "https://node-1.internal",
		LeaseTTL: time.Second, HeartbeatInterval: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.routes())
	defer srv.Close()
	go cluster.Default().RunWhileLeader(ctx, func(ctx context.Context, token uint64) error {
		return s.reportEvery(ctx, 20*time.Millisecond)
	})
	reports := func() (n int) {
		t.Helper()
		if err := db.QueryRow("SELECT COUNT(*) FROM reports").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(5 * time.Second); reports() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the leader wrote no report")
		}
	}

	resp, err := http.Get(srv.URL + "/cluster/leader")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Leader struct{ NodeID, Endpoint string } `json:"leader"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || body.Leader.NodeID != "node-1" || body.Leader.Endpoint != "https://node-1.internal" {
		t.Fatalf("discovery: %d %+v", resp.StatusCode, body)
	}

	post := func() int {
		resp, err := http.PostForm(srv.URL+"/orders", url.Values{"item": {"book"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(); code != http.StatusCreated {
		t.Fatalf("POST /orders on the leader: %d", code)
	}
	if err := cluster.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if code := post(); code != http.StatusServiceUnavailable {
		t.Fatalf("POST /orders after leaving the cluster: %d, want 503", code)
	}
	// Shutdown stopped the report job before it returned.
	n := reports()
	time.Sleep(100 * time.Millisecond)
	if m := reports(); m != n {
		t.Fatalf("%d reports were written after Shutdown", m-n)
	}
	resp, err = http.Get(srv.URL + "/orders")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(text), "1 orders") {
		t.Fatalf("GET /orders = %q, want 1 order", text)
	}
}
