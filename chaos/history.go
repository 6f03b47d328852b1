package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// A record is one line of a node's history file (JSON lines). Times are
// experiment time, nanoseconds (see clock.go).
type record struct {
	T     int64  `json:"t"`
	Kind  string `json:"k"`             // see the kind constants
	Op    string `json:"op,omitempty"`  // a write's id: node.incarnation#n
	Token uint64 `json:"tok,omitempty"` // the fencing token written or granted
	Seq   int64  `json:"seq,omitempty"` // commit-order number of a committed write
	From  int64  `json:"from,omitempty"`
	To    int64  `json:"to,omitempty"`
	Err   string `json:"err,omitempty"`
	What  string `json:"what,omitempty"` // free text: event kind and reason, write style
	Lane  string `json:"lane,omitempty"` // a lane write's key
}

// Record kinds.
const (
	kStart  = "start"  // the process is up; What has its pid and wall clock
	kInvoke = "invoke" // a write begins
	kOK     = "ok"     // the write committed
	kFail   = "fail"   // the write certainly did not commit (refused, or failed before COMMIT)
	kInfo   = "info"   // the outcome is unknown (COMMIT failed or timed out)
	kGrant  = "grant"  // a term was granted to this node within [From, To]
	kBelief = "belief" // this node believed it led throughout [From, To]
	kEvent  = "event"  // a transition the library reported, or "new-failed" (Err has why)
	kRefuse = "refuse" // Fence or AdvanceTip refused (detail in Err); also a kFail
	kBump   = "bump"   // a config-version bump: What "call" when it begins, then "ok" (the version in Seq) or "unknown" (Err) over [From, To]
)

// eventHearing is the What of the kEvent a process records the first time
// its Stats show that it hears releases.
const eventHearing = "hearing-releases"

// eventGuardRefused begins the What of the kEvent a process records when
// one of the library's own statements (Config.Observer's operations) was
// refused by a guard trigger that only raw SQL or a bug should meet: a
// token lowered or reused (SF006, SF009), a lease or lane row deleted, a
// tip rewritten. A stale fence or tip (SF001, SF002) is an answer, not
// this.
const eventGuardRefused = "guard-refused"

// A historyWriter appends records to a file, one write(2) per record and no
// buffering, so a SIGKILL loses at most the record being written.
type historyWriter struct {
	mu sync.Mutex
	f  *os.File
}

func createHistory(path string) (*historyWriter, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &historyWriter{f: f}, nil
}

func (h *historyWriter) add(r record) {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a record always marshals
	}
	b = append(b, '\n')
	h.mu.Lock()
	h.f.Write(b)
	h.mu.Unlock()
}

func (h *historyWriter) close() error { return h.f.Close() }

// readHistory reads a history file. A last line cut short by a SIGKILL is
// skipped; any other unreadable line is an error.
func readHistory(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []record
	var bad []int
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			bad = append(bad, line)
			continue
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(bad) > 1 || (len(bad) == 1 && bad[0] != line) {
		return nil, fmt.Errorf("%s: unreadable lines %v", path, bad)
	}
	return out, nil
}
