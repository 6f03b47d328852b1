package cluster

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	_ "modernc.org/sqlite"
)

// The lanes whose row a provider saw are bounded: a service that keys
// lanes by order id uses new keys without end, and the provider's memory
// must not grow with them.
func TestLaneRowSetIsBounded(t *testing.T) {
	var s laneRowSet
	for i := range 10 * maxLaneRows {
		id := laneID{"leader", fmt.Sprintf("order-%d", i)}
		s.add(id)
		if !s.has(id) {
			t.Fatalf("lane %v forgotten at once", id)
		}
		if n := len(s.seen); n > maxLaneRows {
			t.Fatalf("the set holds %d lanes, more than %d", n, maxLaneRows)
		}
	}
}

// On SQLite every statement that a claim or a keeper's heartbeat runs
// reads the lanes table through an index narrower than the lease name
// (scope) or the instance: by key, by an instance's unexpired lanes, or by
// the lanes renewed within the window; never every lane the scope or the
// instance ever used, so a history of used keys does not slow them down. (PostgreSQL's and MariaDB's rows read are counted by
// TestLaneClaimReadsNoHistory.)
func TestLaneQueriesUseIndexes(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "c.db")+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p := newDBProvider(db, SQLite, "t_", slog.New(slog.DiscardHandler))
	if err := p.Init(ctx); err != nil {
		t.Fatal(err)
	}
	q := p.d.(*sqlite).q
	for name, stmt := range map[string]struct {
		q    string
		args []any
	}{
		"lane_peek":    {q.LanePeek, []any{"leader", 3000, "leader", "i", "leader", "i", 3000, "i", "leader", "h", 3000, "i", "leader", "i", 3000, "leader", "k"}},
		"lane_claim":   {q.LaneClaim, []any{"h", "i", 1000, "leader", "k", "i", 1000}},
		"lane_release": {q.LaneRelease, []any{"leader", "k", "h", "i"}},
		"lane_renew":   {q.LaneRenew, []any{1000, "leader", "i"}},
		"lane_report":  {q.LaneReport, []any{"leader", 3000, "leader", "i", 3000, "i", "leader", "i", 3000, "leader", "leader", "i"}},
	} {
		rows, err := db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+stmt.q, stmt.args...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		t.Logf("%s:\n%s", name, strings.Join(plan, "\n"))
		for _, step := range plan {
			lanes := strings.Contains(step, "t_lanes ") || strings.HasPrefix(step, "SEARCH l ") || strings.HasPrefix(step, "SCAN l")
			whole := strings.HasPrefix(step, "SCAN ") || strings.HasSuffix(step, "(scope=?)") || strings.HasSuffix(step, "(scope=? AND instance=?)")
			if lanes && whole {
				t.Errorf("%s reads every lane of the scope or of the instance: %q", name, step)
			}
		}
	}
}
