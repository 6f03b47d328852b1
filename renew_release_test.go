package cluster_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// A lane released while a renew of its holder waits for the row's lock
// stays released. MySQL reads a statement's clock when the statement
// starts, so a renew that started before the release and ran after it
// found the lane unexpired by its earlier clock and extended a claim the
// release had ended (a keeper's renew that Shutdown cancels can still run
// on the server after Shutdown's release: the lane then stayed held by a
// stopped node for a TTL). PostgreSQL's renew skips a locked lane; SQLite
// has one writer at a time, so there a renew cannot start before a
// release and run after it.
func TestLaneRenewDoesNotReviveAReleasedLane(t *testing.T) {
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
			now := "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000"
			bind := func(q string) string { return q }
			if d == cluster.Postgres {
				now = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
				bind = func(q string) string {
					for i := 1; strings.Contains(q, "?"); i++ {
						q = strings.Replace(q, "?", "$"+string(rune('0'+i)), 1)
					}
					return q
				}
			}
			lanes := tg.Prefix + "lanes"
			if _, err := db.ExecContext(ctx, bind("INSERT INTO "+lanes+" (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) "+
				"VALUES (?, ?, 'h', 'i', 1, "+now+", "+now+", "+now+" + 60000)"), "s", "k"); err != nil {
				t.Fatal(err)
			}

			// The release's transaction locks the lane row; the renew
			// starts and waits for it.
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var one int
			if err := tx.QueryRowContext(ctx, bind("SELECT 1 FROM "+lanes+" WHERE scope = ? AND lane = ? FOR UPDATE"), "s", "k").Scan(&one); err != nil {
				t.Fatal(err)
			}
			renewed := make(chan error, 1)
			go func() {
				_, err := p.RenewLanes(ctx, "s", "i", time.Minute, time.Minute)
				renewed <- err
			}()
			time.Sleep(100 * time.Millisecond) // the renew has read its clock
			if _, err := tx.ExecContext(ctx, bind("UPDATE "+lanes+" SET renewed_at = "+now+", expires_at = "+now+" WHERE scope = ? AND lane = ?"), "s", "k"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-renewed; err != nil {
				t.Fatal(err)
			}
			var renewedAt, expiresAt, at int64
			if err := db.QueryRowContext(ctx, bind("SELECT renewed_at, expires_at, "+now+" FROM "+lanes+" WHERE scope = ? AND lane = ?"), "s", "k").Scan(&renewedAt, &expiresAt, &at); err != nil {
				t.Fatal(err)
			}
			if expiresAt > at {
				t.Fatalf("the lane released while a renew waited is held for %d ms more (renewed at %d, expires at %d): the renew extended the ended claim", expiresAt-at, renewedAt, expiresAt)
			}
		})
	}
}

// The same for the lease: a term released while its holder's renew waited
// for the row's lock stays released, and the renew reports it lost.
// Resign and Shutdown let a renew in flight finish before they release,
// but not one that outlives Shutdown's grace: cancelled by the client, the
// server may still run it.
func TestRenewDoesNotReviveAReleasedTerm(t *testing.T) {
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
			l, err := p.Acquire(ctx, cluster.LeaseRequest{Name: "leader", Holder: "h", Instance: "i", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			now := "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000"
			mark := "?"
			if d == cluster.Postgres {
				now, mark = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint", "$1"
			}
			lease := tg.Prefix + "lease"
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var one int
			if err := tx.QueryRowContext(ctx, "SELECT 1 FROM "+lease+" WHERE name = "+mark+" FOR UPDATE", "leader").Scan(&one); err != nil {
				t.Fatal(err)
			}
			renewed := make(chan error, 1)
			go func() {
				_, err := p.Renew(ctx, l, time.Minute)
				renewed <- err
			}()
			time.Sleep(100 * time.Millisecond) // the renew has read its clock
			if _, err := tx.ExecContext(ctx, "UPDATE "+lease+" SET renewed_at = "+now+", expires_at = "+now+" WHERE name = "+mark, "leader"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-renewed; !errors.Is(err, cluster.ErrLeaseLost) {
				t.Errorf("the renew of a term released while it waited returned %v, want ErrLeaseLost", err)
			}
			var expiresAt, at int64
			if err := db.QueryRowContext(ctx, "SELECT expires_at, "+now+" FROM "+lease+" WHERE name = "+mark, "leader").Scan(&expiresAt, &at); err != nil {
				t.Fatal(err)
			}
			if expiresAt > at {
				t.Fatalf("the term released while a renew waited is held for %d ms more: the renew extended it", expiresAt-at)
			}
		})
	}
}
