package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// TestTermLogHandOver checks that the term log records a release on
// PostgreSQL that hands the next term to a successor in the same UPDATE
// (the library's function hand_over) as two changes: the end of the
// holder's term, then the successor's grant. Logged as a grant alone, the
// released term would be held to the expiry margin and a healed leader's
// release after it self-fenced would read as a margin violation.
func TestTermLogHandOver(t *testing.T) {
	dsn := dialects(t)[cluster.Postgres]
	if dsn == "" {
		t.Skip("needs PostgreSQL (CLUSTER_TEST_POSTGRES_DSN)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tg, err := newTarget(cluster.Postgres, dsn, t.TempDir(), fmt.Sprintf("tl%d_", time.Now().UnixNano()%1e9))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{db: db, tg: tg, e: &experiment{}}
	if err := h.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	defer tg.drop(context.Background(), db)

	l, err := h.lp.Acquire(ctx, cluster.LeaseRequest{Name: "leader", Holder: "n1", Instance: "i1", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.lp.Join(ctx, "leader", cluster.Member{NodeID: "n2", Instance: "i2"}); err != nil {
		t.Fatal(err)
	}
	// n2 takes handed-over terms (what a listening node of schema version
	// 6 records), so n1's release hands it the next term.
	if _, err := db.ExecContext(ctx, "UPDATE "+tg.prefix+"nodes SET hears_releases = 2 WHERE instance = 'i2'"); err != nil {
		t.Fatal(err)
	}
	if err := h.lp.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	fs, err := h.final(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []dbTerm{
		{Token: 1, Holder: "n1", Instance: "i1"},
		{Token: 1, Holder: "n1", Instance: "i1", Ended: true},
		{Token: 2, Holder: "n2", Instance: "i2"},
	}
	got := slices.Clone(fs.Terms)
	for i := range got {
		got[i].Seq = 0
	}
	if !slices.Equal(got, want) {
		t.Fatalf("term log after a release that handed the term over:\n got %+v\nwant %+v", fs.Terms, want)
	}
	for i := 1; i < len(fs.Terms); i++ {
		if fs.Terms[i].Seq <= fs.Terms[i-1].Seq {
			t.Errorf("term log out of order: %+v", fs.Terms)
		}
	}
}
