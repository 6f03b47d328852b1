package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

// releaseRace stages a release that commits while a renew of the same
// row waits for its lock, on a provider over fresh tables of one dialect.
type releaseRace struct {
	db     *sql.DB
	p      *cluster.DBProvider
	prefix string
	now    string // the database clock in unix ms, as the package's statements read it
	pg     bool
}

func newReleaseRace(t *testing.T, d cluster.Dialect) releaseRace {
	t.Helper()
	tg := testdb.New(t, d)
	return raceOn(t, tg, tg.Open(t))
}

// raceOn is newReleaseRace on db, a pool of tg.
func raceOn(t *testing.T, tg testdb.Target, db *sql.DB) releaseRace {
	t.Helper()
	r := releaseRace{db: db, p: initProvider(t, tg, db), prefix: tg.Prefix, now: dbNow(tg.Dialect), pg: tg.Dialect == cluster.Postgres}
	if tg.Dialect == cluster.MySQL {
		r.now = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000"
	}
	return r
}

// heldLane inserts lane key of scope, held by holder h, instance i, under
// token 1 for a minute.
func (r releaseRace) heldLane(t *testing.T, scope, key string) {
	t.Helper()
	if _, err := r.db.ExecContext(context.Background(), r.bind("INSERT INTO "+r.prefix+"lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at) "+
		"VALUES (?, ?, 'h', 'i', 1, "+r.now+", "+r.now+", "+r.now+" + 60000)"), scope, key); err != nil {
		t.Fatal(err)
	}
}

// bind turns q's ? placeholders into PostgreSQL's $n there.
func (r releaseRace) bind(q string) string {
	for i := 1; r.pg && strings.Contains(q, "?"); i++ {
		q = strings.Replace(q, "?", "$"+strconv.Itoa(i), 1)
	}
	return q
}

// run locks the rows of table that match where (with args) in a
// transaction, starts renew, which waits for that lock after reading its
// clock, ends the rows' claim in the locking transaction as a release
// does, and commits. It returns how long the first such row is held
// after (0 or less: released) and renew's error.
func (r releaseRace) run(t *testing.T, table, where string, args []any, renew func() error) (int64, error) {
	t.Helper()
	// One instant for both columns, as a release's statement reads its
	// clock once: PostgreSQL's clock_timestamp() read twice can cross a
	// millisecond and leave expires_at above renewed_at.
	now := r.now
	if r.pg {
		now = "floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint"
	}
	return r.runSet(t, table, where, "renewed_at = "+now+", expires_at = "+now, args, renew)
}

// runSet is run with set, an UPDATE's SET list in which {{now}} is the
// database clock, in place of the release.
func (r releaseRace) runSet(t *testing.T, table, where, set string, args []any, renew func() error) (int64, error) {
	t.Helper()
	set = strings.ReplaceAll(set, "{{now}}", r.now)
	ctx := context.Background()
	table = r.prefix + table
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var one int
	if err := tx.QueryRowContext(ctx, r.bind("SELECT 1 FROM "+table+" WHERE "+where+" FOR UPDATE"), args...).Scan(&one); err != nil {
		t.Fatal(err)
	}
	renewed := make(chan error, 1)
	go func() { renewed <- renew() }()
	time.Sleep(100 * time.Millisecond) // the renew has read its clock
	if _, err := tx.ExecContext(ctx, r.bind("UPDATE "+table+" SET "+set+" WHERE "+where), args...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	renewErr := <-renewed
	var left int64
	if err := r.db.QueryRowContext(ctx, r.bind("SELECT expires_at - "+r.now+" FROM "+table+" WHERE "+where), args...).Scan(&left); err != nil {
		t.Fatal(err)
	}
	return left, renewErr
}

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
			r := newReleaseRace(t, d)
			ctx := context.Background()
			r.heldLane(t, "s", "k")
			left, err := r.run(t, "lanes", "scope = ? AND lane = ?", []any{"s", "k"}, func() error {
				_, err := r.p.RenewLanes(ctx, "s", "i", time.Minute, time.Minute)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if left > 0 {
				t.Fatalf("the lane released while a renew waited is held for %d ms more: the renew extended the ended claim", left)
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
			r := newReleaseRace(t, d)
			ctx := context.Background()
			l, err := r.p.Acquire(ctx, provider.LeaseRequest{Name: "leader", Holder: "h", Instance: "i", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			left, err := r.run(t, "lease", "name = ?", []any{"leader"}, func() error {
				_, err := r.p.Renew(ctx, l, time.Minute)
				return err
			})
			if !errors.Is(err, cluster.ErrLeaseLost) {
				t.Errorf("the renew of a term released while it waited returned %v, want ErrLeaseLost", err)
			}
			if left > 0 {
				t.Fatalf("the term released while a renew waited is held for %d ms more: the renew extended it", left)
			}
		})
	}
}

// An operator's release names the term it means by its token and ends
// that term and no other, atomically in the database: a stale token ends
// nothing and says who holds the lease now, and so does a term that
// changes hands while the release waits for the row (a resign, a
// takeover). Before, clusterctl release -force checked the token and then
// ended whatever term the row held, and -yes did not check at all.
func TestOperatorReleaseEndsOnlyTheTermItNames(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		r := raceOn(t, tg, tg.Open(t))
		p := r.p
		l, err := p.Acquire(ctx, provider.LeaseRequest{Name: "leader", Holder: "x", Instance: "xi", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		var held *cluster.LeaseHeldError
		ok, err := p.ForceRelease(ctx, "leader", l.FencingToken-1)
		if ok || !errors.As(err, &held) || held.Holder != "x" || held.FencingToken != l.FencingToken {
			t.Fatalf("ForceRelease of an earlier token = %v, %v; want false and a LeaseHeldError naming x with token %d", ok, err, l.FencingToken)
		}
		if now, err := p.Leader(ctx, "leader"); err != nil || now == nil || now.NodeID != "x" {
			t.Fatalf("after a release of an earlier token the leader is %+v, %v; want x", now, err)
		}

		if tg.Dialect != cluster.SQLite { // SQLite has one writer: no statement waits mid-way
			left, err := r.runSet(t, "lease", "name = ?",
				"holder = 'z', instance = 'zi', fencing_token = fencing_token + 1, acquired_at = {{now}}, renewed_at = {{now}}, expires_at = {{now}} + 60000",
				[]any{"leader"}, func() error {
					ok, err := p.ForceRelease(ctx, "leader", l.FencingToken)
					if ok {
						return errors.New("released")
					}
					return err
				})
			if !errors.As(err, &held) || held.Holder != "z" || held.FencingToken != l.FencingToken+1 {
				t.Fatalf("a release of x's term that waited while z took over = %v; want a LeaseHeldError naming z with token %d", err, l.FencingToken+1)
			}
			if left <= 0 {
				t.Fatalf("z's term, taken while a release of x's waited, was ended (%d ms left)", left)
			}
			l.FencingToken++
		}

		now, err := p.Leader(ctx, "leader")
		if err != nil || now == nil {
			t.Fatal(now, err)
		}
		if ok, err := p.ForceRelease(ctx, "leader", now.FencingToken); !ok || err != nil {
			t.Fatalf("ForceRelease of the current token = %v, %v; want true", ok, err)
		}
		if ok, err := p.ForceRelease(ctx, "leader", now.FencingToken); ok || err != nil {
			t.Fatalf("ForceRelease of a free lease = %v, %v; want false, nil", ok, err)
		}
	})
}

// The same for a lane: the operator's release names the claim by the
// lane's token, and a claim that changes hands while it waits is left
// alone.
func TestOperatorLaneReleaseEndsOnlyTheClaimItNames(t *testing.T) {
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			r := newReleaseRace(t, d)
			ctx := context.Background()
			r.heldLane(t, "s", "k")
			var held *cluster.LaneHeldError
			left, err := r.runSet(t, "lanes", "scope = ? AND lane = ?",
				"holder = 'z', instance = 'zi', fencing_token = 2, acquired_at = {{now}}, renewed_at = {{now}}, expires_at = {{now}} + 60000",
				[]any{"s", "k"}, func() error {
					ok, err := r.p.ForceReleaseLane(ctx, "s", "k", 1)
					if ok {
						return errors.New("released")
					}
					return err
				})
			if !errors.As(err, &held) || held.Holder != "z" || held.FencingToken != 2 {
				t.Fatalf("a release of h's claim that waited while z claimed the lane = %v; want a LaneHeldError naming z with token 2", err)
			}
			if left <= 0 {
				t.Fatalf("z's claim, made while a release of h's waited, was ended (%d ms left)", left)
			}
		})
	}
}

// A lane an operator released while its holder's claim of it (a renewal
// of its own claim) waited for the row's lock stays released: the claim
// does not revive it for another TTL under the same token. MySQL reads
// the statement's clock before the wait, and PostgreSQL re-checks the
// row with the clock it read before; both found the lane unexpired and
// the holder's own.
func TestLaneClaimDoesNotReviveAReleasedLane(t *testing.T) {
	for _, d := range []cluster.Dialect{cluster.Postgres, cluster.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			r := newReleaseRace(t, d)
			ctx := context.Background()
			r.heldLane(t, "s", "k")
			var got cluster.Lane
			left, err := r.run(t, "lanes", "scope = ? AND lane = ?", []any{"s", "k"}, func() error {
				tx, err := r.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				got, err = r.p.ClaimLane(ctx, cluster.TxQuerier(tx), provider.LaneRequest{Scope: "s", Key: "k", Holder: "h", Instance: "i", TTL: time.Minute})
				if err != nil {
					return err
				}
				return tx.Commit()
			})
			t.Logf("claim: %+v, %v; held %d ms more", got, err, left)
			if err == nil && got.FencingToken == 1 || left > 0 && got.FencingToken <= 1 {
				t.Fatalf("the claim that waited for an operator's release = %+v, %v, and the lane is held %d ms more: the claim revived the released claim under token 1", got, err, left)
			}
		})
	}
}
