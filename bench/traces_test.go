package main

import (
	"strings"
	"testing"
	"time"
)

// A traced Shutdown handoff is split at the leader's and the successor's
// lines; a handoff whose successor never leads within the window, and
// another system's acquisitions, are not counted.
func TestSplitHandoffs(t *testing.T) {
	const trace = `compare: some output of the run
trace 1000000 pgx-0-g1 shutdown call start
trace 1100000 pgx-0-g1 release ok start
trace 1150000 postgres-1-g2 acquire ok start
trace 2900000 pgx-1-g2 acquire ok start
trace 2800000 pgx-0-g1 release ok end
trace 3400000 pgx-1-g2 acquire ok end
trace 3450000 pgx-1-g2 acquired event x
trace 3460000 pgx-1-g2 renew ok start
trace 9000000 pgx-1-g2 release ok start
trace 9900000 pgx-1-g2 release ok end
trace 900000000 pgx-2-g3 acquire ok start
`
	lines, err := readTraces(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	got := splitHandoffs(lines, 50*time.Millisecond)
	if len(got) != 1 || len(got["pgx"]) != 1 {
		t.Fatalf("found %v; want one handoff of pgx", got)
	}
	h := got["pgx"][0]
	at := func(ns int64) time.Time { return time.Unix(0, ns) }
	want := handoffSplit{call: at(1000000), release: at(1100000), released: at(2800000), took: at(2900000), taken: at(3400000), leads: at(3450000)}
	if h != want {
		t.Fatalf("split %+v; want %+v", h, want)
	}
	for member, system := range map[string]string{"pgx-1-g2": "pgx", "etcd/procs-0-g1": "etcd/procs", "mariadb-2-g10": "mariadb"} {
		if got := systemOf(member); got != system {
			t.Errorf("systemOf(%q) = %q, want %q", member, got, system)
		}
	}
}
