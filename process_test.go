//go:build unix

package cluster_test

import (
	"database/sql"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// Nodes in separate processes: a leader stopped with SIGSTOP past its lease
// sees IsLeader false at once when it resumes, a leader killed with SIGKILL
// is replaced after the TTL, and the fenced writes of all of them commit in
// token order.
func TestMultiProcess(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		setup := tg.Open(t)
		createWriteLog(t, tg, setup)
		count := func(q string, args ...any) func() int64 {
			return func() int64 {
				var n int64
				if err := setup.QueryRow(bind(tg.Dialect, q), args...).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		wrote := func(ch *child) func() bool {
			rows := count("SELECT COUNT(*) FROM "+tg.Prefix+"writes WHERE node = ?", ch.id)
			return func() bool { return rows() > 0 }
		}
		termsWritten := count("SELECT COUNT(DISTINCT token) FROM " + tg.Prefix + "writes")
		a := spawn(t, tg, "a")
		await(t, 20*time.Second, "event lease-acquired", mark(a))
		b, c := spawn(t, tg, "b"), spawn(t, tg, "c")
		// b and c are up and see a lead, and a's term has written.
		await(t, 20*time.Second, "event leader-changed", map[*child]int{b: 0})
		await(t, 20*time.Second, "event leader-changed", map[*child]int{c: 0})
		waitFor(t, 5*time.Second, "a's writes", wrote(a))

		// Pause the leader past its lease, between two writes.
		m := mark(a)
		a.signal(t, syscall.SIGUSR1)
		await(t, 5*time.Second, "quiet", m)
		m = mark(a, b, c)
		// Stop it just after a renew, and not inside a write (its
		// membership refresh follows the renew): a process stopped while
		// it holds SQLite's write lock blocks every node until it resumes,
		// which is SQLite's nature, not what this test is about.
		afterRenew(t, tg, setup)
		stopOutsideWrite(t, tg, a)
		stopped := time.Now()
		second, _ := await(t, 10*time.Second, "event lease-acquired", mark(b, c))
		// Keep a stopped past its lease: a pause, not a wait for an event.
		time.Sleep(time.Until(stopped.Add(3 * testdb.LeaseTTL / 2)))
		a.signal(t, syscall.SIGCONT)
		if _, l := await(t, 5*time.Second, "resumed", m); !strings.HasPrefix(l, "resumed leader=false") {
			t.Fatalf("a resumed after %v believing it led: %q", time.Since(stopped), l)
		}
		await(t, 5*time.Second, "event lease-lost", m)
		// Its leader work was told before it could lead again.
		await(t, 5*time.Second, "work-stopped", m)
		stoppedAt, acquiredAt := -1, -1
		for i, l := range a.output()[m[a]:] {
			if strings.HasPrefix(l, "work-stopped") && stoppedAt < 0 {
				stoppedAt = i
			}
			if strings.HasPrefix(l, "event lease-acquired") && acquiredAt < 0 {
				acquiredAt = i
			}
		}
		if acquiredAt >= 0 && acquiredAt < stoppedAt {
			t.Fatalf("a led again before its old term's work context was cancelled: %q", a.output()[m[a]:])
		}
		m = mark(a)
		a.signal(t, syscall.SIGUSR2)
		await(t, 5*time.Second, "writing", m)
		waitFor(t, 5*time.Second, second.id+"'s writes", wrote(second))

		// Kill the second leader outright; another process takes over once
		// its lease expires.
		third := b
		if second == b {
			third = c
		}
		m = mark(third, a)
		second.signal(t, syscall.SIGKILL)
		killed := time.Now()
		third, _ = await(t, 10*time.Second, "event lease-acquired", m)
		t.Logf("%s took over %v after SIGKILL", third.id, time.Since(killed).Round(time.Millisecond))
		waitFor(t, 5*time.Second, "writes under a third term", func() bool { return termsWritten() >= 3 })

		survivors := []*child{a, b}
		if second == b {
			survivors = []*child{a, c}
		}
		for _, ch := range survivors {
			ch.signal(t, syscall.SIGTERM)
			select {
			case err := <-ch.exit:
				ch.exit <- err
				if err != nil {
					t.Errorf("%s exited: %v", ch.id, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not exit on SIGTERM", ch.id)
			}
			if _, ok := ch.has("bye"); !ok {
				t.Errorf("%s did not shut down cleanly", ch.id)
			}
			if l, ok := ch.has("error"); ok {
				t.Errorf("%s: %s", ch.id, l)
			}
		}

		writers := map[string]int{}
		terms := map[int64]string{}
		for _, w := range readWriteLog(t, tg, setup) {
			writers[w.node]++
			if n, ok := terms[w.token]; ok && n != w.node {
				t.Fatalf("token %d was used by %s and %s", w.token, n, w.node)
			}
			terms[w.token] = w.node
		}
		t.Logf("commits by node: %v; node of each term: %v", writers, terms)
		// Three terms wrote (the third may be a's again), each its own node's.
		if len(terms) < 3 || len(writers) < 2 {
			t.Fatalf("want commits under three terms from at least two processes, got terms %v", terms)
		}
	})
}

// stopOutsideWrite stops ch with SIGSTOP. On SQLite, while the file's
// write lock stays held for 30ms after the stop (ch stopped inside a write
// transaction), it resumes ch and stops it again a few milliseconds later.
func stopOutsideWrite(t *testing.T, tg testdb.Target, ch *child) {
	t.Helper()
	var probe *sql.DB
	if tg.Dialect == cluster.SQLite {
		file, _, _ := strings.Cut(tg.DSN, "?")
		probe = tg.OpenDSN(t, file+"?_pragma=busy_timeout(0)&_txlock=immediate")
	}
	held := func() bool {
		for i := 0; i < 4; i++ {
			if i > 0 {
				time.Sleep(10 * time.Millisecond)
			}
			tx, err := probe.Begin()
			var se interface{ Code() int }
			if errors.As(err, &se) && se.Code()&0xff == 5 {
				continue // SQLITE_BUSY: someone holds the write lock
			}
			if err != nil {
				t.Fatal(err)
			}
			tx.Rollback()
			return false
		}
		return true
	}
	for try := 0; ; try++ {
		ch.signal(t, syscall.SIGSTOP)
		if probe == nil || !held() {
			return
		}
		if try == 50 {
			t.Fatalf("%s held SQLite's write lock at each of 50 stops", ch.id)
		}
		t.Logf("%s: stop %d landed inside a write transaction; resumed it", ch.id, try+1)
		ch.signal(t, syscall.SIGCONT)
		time.Sleep(time.Duration(5+try%20) * time.Millisecond)
	}
}
