package cluster_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// A claim reads only the lanes that matter now, not every lane the lease
// name ever used: with 5,000 released lanes that this node's process once
// held, a claim of a new lane (its fair-share census and the claim, in the
// caller's transaction) reads far fewer rows of the lanes table than that,
// as counted by the server for the transaction (PostgreSQL's
// pg_stat_xact_user_tables) or the session (MariaDB's Handler_read
// counters). Before, the census read every lane of the scope, and every
// lane the instance had held, on each claim and each keeper heartbeat.
// BenchmarkLaneHistory measures the time; SQLite's plans are checked by
// TestLaneQueriesUseIndexes.
func TestLaneClaimReadsNoHistory(t *testing.T) {
	t.Parallel()
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			const history = 5000
			tg := testdb.New(t, d)
			db := tg.Open(t)
			a := startOn(t, tg, db, "a")
			ctx := context.Background()
			members, err := a.Members(ctx)
			if err != nil || len(members) != 1 {
				t.Fatal(members, err)
			}
			addHistory(t, tg, db, "a", members[0].Instance, history)
			analyze := "ANALYZE " + tg.Prefix + "lanes"
			if tg.Dialect == cluster.MySQL {
				analyze = "ANALYZE TABLE " + tg.Prefix + "lanes"
			}
			if _, err := db.Exec(analyze); err != nil {
				t.Fatal(err)
			}

			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			tx, err := conn.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			before := rowsRead(t, tg, tx)
			if _, err := a.ClaimLane(ctx, tx, "fresh"); err != nil {
				t.Fatal(err)
			}
			read := rowsRead(t, tg, tx) - before
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if read >= history/10 {
				t.Fatalf("a claim read %d rows of the lanes table, which holds %d released lanes: it reads the history", read, history)
			}
			t.Logf("a claim read %d rows beside %d released lanes", read, history)
		})
	}
}

// addHistory adds n lanes of lease name "leader" that node holder's
// process instance held and released an hour ago, in batches of 1000
// rows, with their high-water marks (written by the guards).
func addHistory(t testing.TB, tg testdb.Target, db *sql.DB, holder, instance string, n int) {
	t.Helper()
	ago := strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10)
	for done := 0; done < n; {
		var q strings.Builder
		q.WriteString("INSERT INTO " + tg.Prefix + "lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) VALUES ")
		for j := 0; j < 1000 && done < n; j++ {
			if j > 0 {
				q.WriteString(", ")
			}
			q.WriteString("('leader', 'old-" + strconv.Itoa(done) + "', '" + holder + "', '" + instance + "', 1, " + ago + ", " + ago + ", " + ago + ")")
			done++
		}
		if _, err := db.Exec(q.String()); err != nil {
			t.Fatal(err)
		}
	}
}

// rowsRead is the server's count of rows of the lanes table read in tx
// (PostgreSQL) or of rows read on tx's session (MySQL).
func rowsRead(t *testing.T, tg testdb.Target, tx *sql.Tx) int64 {
	t.Helper()
	ctx := context.Background()
	if tg.Dialect == cluster.Postgres {
		var n int64
		if err := tx.QueryRowContext(ctx, "SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables WHERE relid = $1::regclass",
			tg.Prefix+"lanes").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rows, err := tx.QueryContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_read%'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			t.Fatal(err)
		}
		if name == "Handler_read_next" || name == "Handler_read_prev" || name == "Handler_read_rnd_next" {
			n += v
		}
	}
	return n
}
