package main

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// An operator's release ends the term it read and no other, even when the
// lease changes hands between the read and the release: clusterctl
// release -force -yes reads the term, then its release waits for the row
// (locked here by a transaction that hands the lease to another holder
// under the next token, as a takeover does) and must leave the new term
// alone, failing with who holds the lease now. Before, the release carried
// no token and ended whatever term it found. The same for release -lane.
// (SQLite has one writer: a statement never waits mid-way, and the read
// and the release cannot be pulled apart from outside.)
func TestReleaseEndsOnlyTheTermItRead(t *testing.T) {
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			tg := testdb.New(t, d)
			ctx := context.Background()
			db := tg.Open(t)
			p, err := cluster.NewDBProvider(db, d, tg.Prefix)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Init(ctx); err != nil {
				t.Fatal(err)
			}
			l, err := p.Acquire(ctx, provider.LeaseRequest{Name: "leader", Holder: "x", Instance: "xi", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			lk := locker{t: t, tg: tg, db: db}
			lk.insertLane()

			r := lk.racing("lease", "name = 'leader'", on(tg, "release", "-force", "-yes")...)
			failed(t, r, exitFail, `lease "leader" changed hands`, `node "z" (token `+strconv.FormatUint(l.FencingToken+1, 10)+`)`, "nothing released")
			if now, err := p.Leader(ctx, "leader"); err != nil || now == nil || now.NodeID != "z" {
				t.Fatalf("after the release of x's term the leader is %+v, %v; want z, whose term it must not end", now, err)
			}

			r = lk.racing("lanes", "scope = 'leader' AND lane = 'k'", on(tg, "release", "-lane", "k", "-force", "-yes")...)
			failed(t, r, exitFail, `lane "k" changed hands`, `node "z" (token 2)`, "nothing released")
			if lane, err := p.ReadLane(ctx, "leader", "k"); err != nil || lane == nil || lane.Holder != "z" || lane.Remaining <= 0 {
				t.Fatalf("after the release of h's claim lane k is %+v, %v; want z's claim, which it must not end", lane, err)
			}
		})
	}
}

// locker stages a change of hands under a row lock while clusterctl waits.
type locker struct {
	t  *testing.T
	tg testdb.Target
	db *sql.DB
}

func (lk locker) now() string {
	if lk.tg.Dialect == cluster.Postgres {
		return "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
	}
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000"
}

// insertLane makes lane k of lease leader held by h under token 1.
func (lk locker) insertLane() {
	n := lk.now()
	if _, err := lk.db.Exec("INSERT INTO " + lk.tg.Prefix + "lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) " +
		"VALUES ('leader', 'k', 'h', 'hi', 1, " + n + ", " + n + ", " + n + " + 60000)"); err != nil {
		lk.t.Fatal(err)
	}
}

// racing locks the rows of table matching where, runs clusterctl with
// args, waits until a statement of it waits for that lock, hands the rows
// to holder z under the next token, commits, and returns clusterctl's run.
func (lk locker) racing(table, where string, args ...string) result {
	t := lk.t
	ctx := context.Background()
	tx, err := lk.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var one int
	if err := tx.QueryRowContext(ctx, "SELECT 1 FROM "+lk.tg.Prefix+table+" WHERE "+where+" FOR UPDATE").Scan(&one); err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() { done <- ctl(t, args...) }()
	waiting := "SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
	if lk.tg.Dialect == cluster.MySQL {
		// MariaDB lists a statement waiting for a row lock as Updating.
		waiting = "SELECT info FROM information_schema.processlist WHERE state = 'Updating'"
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if lk.waiting(waiting) {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("clusterctl ended without waiting for the row: exit %d, %s%s", r.code, r.stdout, r.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("clusterctl's release never waited for the locked row")
		}
		time.Sleep(10 * time.Millisecond)
	}
	n := lk.now()
	set := strings.NewReplacer("{{now}}", n).Replace("holder = 'z', instance = 'zi', fencing_token = fencing_token + 1, " +
		"acquired_at = {{now}}, renewed_at = {{now}}, expires_at = {{now}} + 60000")
	if _, err := tx.ExecContext(ctx, "UPDATE "+lk.tg.Prefix+table+" SET "+set+" WHERE "+where); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return <-done
}

// waiting reports whether a statement on the target's tables is among
// those query lists.
func (lk locker) waiting(query string) bool {
	rows, err := lk.db.Query(query)
	if err != nil {
		lk.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var q sql.NullString
		if err := rows.Scan(&q); err != nil {
			lk.t.Fatal(err)
		}
		if strings.Contains(q.String, lk.tg.Prefix) {
			return true
		}
	}
	return false
}
