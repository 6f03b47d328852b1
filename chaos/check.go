package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/sqlfence/cluster"
)

// beliefSlack is how much two belief intervals may overlap before it is an
// anomaly. The library's guarantee leaves a gap of at least
// LeaseTTL - FenceTimeout between one node's belief ending and another's
// acquisition (see RELIABILITY.md), so any overlap is a violation; the
// slack covers only measurement: every process reads the one
// CLOCK_MONOTONIC, and a node's experiment time differs from it by the few
// microseconds between two clock reads at its start.
const beliefSlack = time.Millisecond

// Anomaly kinds.
const (
	aLinearizability = "not-linearizable"        // porcupine found no linearization against the fenced-register model
	aCheckTimeout    = "linearizability-unknown" // porcupine ran out of time
	aGrantOrder      = "grant-order"             // a grant completed before another with a lower token began
	aDuplicateGrant  = "duplicate-grant"         // two grants of one token
	aGrantAboveMark  = "grant-above-mark"        // a token granted above the database's high-water mark
	aTokenRegression = "token-regression"        // a committed row with a lower token than an earlier commit's
	aSeqGap          = "seq-gap"                 // commit-order numbers are not contiguous
	aStaleCommit     = "stale-commit"            // a write committed after a higher token's grant, in the database's order
	aAfterRelease    = "commit-after-release"    // a fenced write committed after its own term was released, in the database's order
	aEarlyCommit     = "commit-before-grant"     // a write committed under a token before the database granted it
	aTokenReused     = "token-reused"            // the database gave one token to two holders or instances
	aTermOrder       = "term-order"              // the term log's tokens went down
	aGuardRefused    = "guard-refused"           // a guard trigger refused one of the library's own statements
	aLostWrite       = "lost-write"              // an acknowledged write is missing, or differs
	aRefusedPresent  = "refused-write-committed" // a write that failed before COMMIT is in the database
	aUnknownRow      = "unknown-row"             // a row no node wrote
	aChainBroken     = "chain-broken"            // the audit chain or its tip does not verify
	aOverlap         = "overlapping-leaders"     // two processes believed they led at once
	aMargin          = "margin"                  // a term was granted less than LeaseTTL - FenceTimeout after its predecessor's belief ended
	aConfigRepeat    = "config-repeated"         // two bumps returned one config version, or a bump returned one not above a bump that returned before it began
	aConfigLost      = "config-lost"             // the database's config version is below what the acknowledged bumps add up to
	aConfigPhantom   = "config-phantom"          // the database's config version is above what every bump invoked could add up to
	aSlowRecovery    = "slow-recovery"           // no leader within LeaseTTL + 2 heartbeats of a heal
	aHistory         = "history-unreadable"      // a history line could not be interpreted
	aCrash           = "node-exited"             // a node process exited when the harness did not end it
	aNoProgress      = "no-progress"             // no write was acknowledged: the experiment tested nothing
	aNeverHeard      = "never-heard"             // postgres+pgx: no process heard a release, so NOTIFY was not tested
)

type anomaly struct {
	Kind   string
	Detail string
}

// result is what an experiment found.
type result struct {
	Dialect  cluster.Dialect
	Stack    string `json:",omitempty"`
	Seed     uint64
	Duration time.Duration
	Nodes    int
	Mutant   string
	Plan     int
	Timings  timings

	Writes int // write operations invoked
	// Styles counts the writes invoked by style (the workloads: fenced
	// with the chain, plain fenced, stale), StylesOK those acknowledged.
	Styles, StylesOK map[string]int
	Outcomes         map[string]int // by outcome: ok, refused, error, info-committed, info-absent
	StaleWrites      int            // writes under an ended term's token
	StaleOK          int            // of which committed (legitimately only while that token was still current)
	Grants           int
	Beliefs          int
	Faults           map[string]int
	FaultList        []fault
	Anomalies        []anomaly
	Recovery         []time.Duration // time from each heal with no leader to the next belief
	Heals            int
	Gaps             []time.Duration // every interval in which no process believed it led
	Failovers        []time.Duration // from a fault that ended its target's belief to the next belief
	Handoffs         []time.Duration // the same for resign faults alone
	Hearing          int             // processes (incarnations) that heard releases at some point (Stats.HearingReleases)
	LongestGap       string          // the longest interval without a leader, and the faults in force during it
	MinGap           time.Duration   // the smallest gap between two processes' beliefs
	// MinMargin is the smallest time from the end of a belief to the
	// completion of the next term's grant, over the Margins terms that
	// expired (not released); negative when the grant came first. Margin
	// is what the design promises: LeaseTTL - FenceTimeout.
	MinMargin, Margin time.Duration
	Margins           int // the terms MinMargin was taken over

	// The config-version workload: bumps invoked, acknowledged (the
	// others' outcome is unknown), and the version in the database at
	// the end.
	Bumps, BumpsOK int
	ConfigVersion  int64
	Linearized     int // operations porcupine checked
	CheckTime      time.Duration
	ChainRows      int
	Rows           int
	LaneRows       int // rows of the lanes workload
	// TermChanges is the number of entries in the database's term log
	// (grants and early ends), TermsEnded those that ended a term.
	TermChanges, TermsEnded int
	// Terms is the number of the lease's terms in the term log (grants of
	// a new token), Again those won by the node (NodeID) that held the
	// term before: a restarted or released leader winning again.
	Terms, Again int
}

// label is the dialect and, when not database/sql, the stack.
func (r *result) label() string {
	if r.Stack == stackSQL {
		return string(r.Dialect)
	}
	return string(r.Dialect) + "+" + r.Stack
}

func (r *result) add(kind, format string, args ...any) {
	r.Anomalies = append(r.Anomalies, anomaly{Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

type checkInput struct {
	stack      string
	dialect    cluster.Dialect
	timings    timings
	histories  map[string][]record // by process: node.incarnation
	faults     []fault
	final      *finalState
	start, end int64 // the nemesis began; the nodes were stopped
	dir        string
}

// A writeOp is one write as the history tells it.
type writeOp struct {
	proc    string
	id      string
	style   string
	lane    string // a lane write's key
	call    int64
	ret     int64 // 0 without an outcome
	outcome string
	what    string
	token   uint64
	seq     int64
	err     string
}

type belief struct {
	proc     string
	token    uint64
	from, to int64
}

type grant struct {
	proc     string
	token    uint64
	from, to int64
	what     string
}

func check(in checkInput) *result {
	res := &result{Dialect: in.dialect, Stack: in.stack, Timings: in.timings, Outcomes: map[string]int{}, Faults: map[string]int{}, FaultList: in.faults,
		Styles: map[string]int{}, StylesOK: map[string]int{}}
	for _, f := range in.faults {
		res.Faults[f.Kind]++
	}
	ops, grants, beliefs, released := collect(in.histories, res)
	res.Grants, res.Beliefs = len(grants), len(beliefs)
	checkNoRollback(in.histories, res)
	present := checkWrites(in.final, ops, res)
	if res.Outcomes["ok"] == 0 {
		res.add(aNoProgress, "none of %d writes was acknowledged", len(ops))
	}
	checkCommitOrder(in.final, res)
	checkTerms(in.final, ops, res)
	checkChain(in.final, ops, res)
	checkGrants(in.final, grants, res)
	checkLinearizable(ops, grants, present, in, res)
	// An operator's release ends a term while its holder may still
	// believe it leads, for up to FenceTimeout: its fence refuses, and
	// the next term may begin at once. Such a term is left out of the
	// overlap and margin checks; checkTerms holds its writes.
	// A term the database shows ended early (the term log: a release,
	// the holder's own after it self-fenced, or an operator's) may be
	// followed at once: its holder stopped believing before it ended.
	ended := map[uint64]bool{}
	if in.final != nil {
		for _, t := range in.final.Terms {
			if t.Ended && t.Lane == "" {
				ended[uint64(t.Token)] = true
				released[uint64(t.Token)] = true
			}
		}
	}
	// An operator's release counts only when the term log shows it ended
	// the term (the call may have failed, or found the term over), and
	// its holder's belief may outlast it by FenceTimeout at most: until
	// then its last renew's trust lasts.
	forced := map[uint64]int64{}
	for _, f := range in.faults {
		if f.Kind == faultRelease && f.Token != 0 && ended[f.Token] {
			forced[f.Token] = max(forced[f.Token], f.End+int64(in.timings.FenceTimeout))
		}
	}
	checkBeliefs(beliefs, forced, res)
	checkMargin(beliefs, grants, released, in, res)
	checkConfig(in, res)
	checkRecovery(beliefs, in, res)
	var longest [2]int64
	res.Gaps, longest = leaderless(beliefs, in.start, in.end)
	if len(res.Gaps) > 0 {
		var during []string
		for _, f := range in.faults {
			if f.Start <= longest[1] && f.End >= longest[0] {
				during = append(during, fmt.Sprintf("%s at %s on %s", f.Detail, sec(f.Start), f.Node))
			}
		}
		res.LongestGap = fmt.Sprintf("%v from %s", time.Duration(longest[1]-longest[0]).Round(time.Millisecond), sec(longest[0]))
		if len(during) > 0 {
			res.LongestGap += ", during " + strings.Join(during, "; ")
		}
	}
	// Resigns are handoffs, measured apart from the faults that end a
	// leader's belief against its will.
	var resigns, others []fault
	for _, f := range in.faults {
		if f.Kind == faultResign {
			resigns = append(resigns, f)
		} else {
			others = append(others, f)
		}
	}
	res.Failovers = failovers(beliefs, others)
	res.Handoffs = failovers(beliefs, resigns)
	if in.stack == stackPgx && res.Hearing == 0 {
		res.add(aNeverHeard, "no process ever heard releases (Stats.HearingReleases): the listeners never worked, so the experiment did not test the NOTIFY path")
	}
	return res
}

// failovers measures, for each fault whose target believed it led when
// the fault began and stopped believing before its heal, how long after
// the fault began a process (another, or the same one again) believed it
// led. A killed or paused
// process records its belief until at most 50ms before the fault (see
// node.sample), hence the tolerance.
func failovers(bs []belief, faults []fault) []time.Duration {
	var out []time.Duration
	for _, f := range faults {
		for _, b := range bs {
			if node, _, _ := strings.Cut(b.proc, "."); node != f.Node || b.from > f.Start || b.to < f.Start-int64(100*time.Millisecond) || b.to > f.End {
				continue
			}
			next := int64(-1) // the next belief of any process, the faulted one included
			for _, o := range bs {
				if o.from > b.to && (next < 0 || o.from < next) {
					next = o.from
				}
			}
			if next >= 0 {
				out = append(out, time.Duration(next-f.Start))
			}
			break
		}
	}
	return out
}

// leaderless returns the lengths of the intervals between start and end
// in which no process believed it led, and the longest of them.
func leaderless(bs []belief, start, end int64) ([]time.Duration, [2]int64) {
	var longest [2]int64
	sorted := slices.Clone(bs)
	slices.SortFunc(sorted, func(a, b belief) int { return int(a.from - b.from) })
	var gaps []time.Duration
	covered := start
	for _, b := range sorted {
		if b.from > covered && b.from < end {
			gaps = append(gaps, time.Duration(b.from-covered))
			if b.from-covered > longest[1]-longest[0] {
				longest = [2]int64{covered, b.from}
			}
		}
		covered = max(covered, b.to)
	}
	return gaps, longest
}

// collect turns the histories into writes, grants and belief intervals,
// and the tokens of the terms their holders released.
func collect(hs map[string][]record, res *result) (map[string]*writeOp, []grant, []belief, map[uint64]bool) {
	ops := map[string]*writeOp{}
	released := map[uint64]bool{}
	guards := 0
	var grants []grant
	var beliefs []belief
	procs := make([]string, 0, len(hs))
	for p := range hs {
		procs = append(procs, p)
	}
	sort.Strings(procs)
	for _, p := range procs {
		open := map[[2]int64]int{} // (token, from) -> index in beliefs
		for _, r := range hs[p] {
			switch r.Kind {
			case kInvoke:
				ops[r.Op] = &writeOp{proc: p, id: r.Op, style: r.What, lane: r.Lane, call: r.T, token: r.Token}
			case kOK, kFail, kInfo:
				o := ops[r.Op]
				if o == nil {
					res.add(aHistory, "%s: outcome of %s without its invocation", p, r.Op)
					continue
				}
				o.ret, o.outcome, o.what, o.token, o.seq, o.err = r.T, r.Kind, r.What, r.Token, r.Seq, r.Err
			case kEvent:
				if r.What == eventHearing {
					res.Hearing++
				}
				if strings.HasPrefix(r.What, string(cluster.EventLeaseReleased)) {
					released[r.Token] = true
				}
				if strings.HasPrefix(r.What, eventGuardRefused) {
					// The guards are for raw SQL and for bugs: the library's
					// own acquire, renew, release or claim never meets one.
					if guards++; guards <= 10 {
						res.add(aGuardRefused, "%s at %s: %s refused: %s", p, sec(r.T), strings.TrimPrefix(r.What, eventGuardRefused+" "), r.Err)
					}
				}
			case kGrant:
				grants = append(grants, grant{proc: p, token: r.Token, from: r.From, to: r.To, what: r.What})
			case kBelief:
				k := [2]int64{int64(r.Token), r.From}
				if i, ok := open[k]; ok {
					beliefs[i].to = max(beliefs[i].to, r.To)
					continue
				}
				open[k] = len(beliefs)
				beliefs = append(beliefs, belief{proc: p, token: r.Token, from: r.From, to: r.To})
			}
		}
	}
	if guards > 10 {
		res.add(aGuardRefused, "and %d more of the library's statements refused by a guard", guards-10)
	}
	res.Writes = len(ops)
	return ops, grants, beliefs, released
}

// checkNoRollback: no node refused to start with ErrRollbackDetected.
// This experiment never rolls its database back (the failover experiment,
// which does, expects such refusals and counts them itself).
func checkNoRollback(hs map[string][]record, res *result) {
	procs := slices.Sorted(maps.Keys(hs))
	for _, p := range procs {
		for _, r := range hs[p] {
			if r.Kind == kEvent && strings.HasPrefix(r.What, "new-failed") && strings.Contains(r.What, string(cluster.EventRollbackDetected)) {
				res.add(aFalseRollback, "%s at %s: %s", p, sec(r.T), r.Err)
			}
		}
	}
}

// checkWrites compares every write's outcome with the final database, and
// returns the ids of the writes whose rows are there.
func checkWrites(fs *finalState, ops map[string]*writeOp, res *result) map[string]dbWrite {
	present := map[string]dbWrite{}
	for _, w := range slices.Concat(fs.Writes, fs.LaneWrites) {
		present[w.Op] = w
		if ops[w.Op] == nil {
			res.add(aUnknownRow, "row #%d (token %d, op %q) was written by no recorded operation", w.Seq, w.Token, w.Op)
		}
	}
	res.Rows = len(fs.Writes)
	res.LaneRows = len(fs.LaneWrites)
	for _, o := range sortedOps(ops) {
		w, in := present[o.id]
		res.Styles[o.style]++
		if o.outcome == kOK {
			res.StylesOK[o.style]++
		}
		if !fenced(o.style) && o.style != styleLane {
			res.StaleWrites++
			if in {
				res.StaleOK++
			}
		}
		switch o.outcome {
		case kOK:
			res.Outcomes["ok"]++
			switch {
			case !in:
				res.add(aLostWrite, "%s (token %d, #%d) was acknowledged but is not in the database", o.id, o.token, o.seq)
			case w.Seq != o.seq || uint64(w.Token) != o.token:
				res.add(aLostWrite, "%s was acknowledged as #%d token %d but the database has #%d token %d", o.id, o.seq, o.token, w.Seq, w.Token)
			}
		case kFail:
			res.Outcomes[o.what]++
			if in {
				res.add(aRefusedPresent, "%s failed before COMMIT (%s) but is in the database as #%d token %d", o.id, o.err, w.Seq, w.Token)
			}
		default: // info, or no outcome (the process died)
			if in {
				res.Outcomes["info-committed"]++
			} else {
				res.Outcomes["info-absent"]++
			}
		}
	}
	return present
}

func sortedOps(ops map[string]*writeOp) []*writeOp {
	out := make([]*writeOp, 0, len(ops))
	for _, o := range ops {
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b *writeOp) int {
		if a.call != b.call {
			return int(a.call - b.call)
		}
		return strings.Compare(a.id, b.id)
	})
	return out
}

// checkCommitOrder: along commit order (seq), tokens never go down, and
// seq has no gaps (each write and each entry of the term log takes the
// next number in its transaction).
func checkCommitOrder(fs *finalState, res *result) {
	seqs := make([]int64, 0, len(fs.Writes)+len(fs.LaneWrites)+len(fs.Terms))
	for _, w := range slices.Concat(fs.Writes, fs.LaneWrites) {
		seqs = append(seqs, w.Seq)
	}
	for _, t := range fs.Terms {
		seqs = append(seqs, t.Seq)
	}
	slices.Sort(seqs)
	for i, s := range seqs {
		if s != int64(i+1) {
			res.add(aSeqGap, "number %d of the counter's order is #%d (write log and term log together)", i+1, s)
			break
		}
	}
	for i, w := range fs.Writes {
		if i > 0 && w.Token < fs.Writes[i-1].Token {
			prev := fs.Writes[i-1]
			res.add(aTokenRegression, "#%d %s committed under token %d after #%d %s under token %d", w.Seq, w.Op, w.Token, prev.Seq, prev.Op, prev.Token)
		}
	}
	last := map[string]dbWrite{} // per lane, the last write so far
	for _, w := range fs.LaneWrites {
		if prev, ok := last[w.Lane]; ok && w.Token < prev.Token {
			res.add(aTokenRegression, "lane %s: #%d %s committed under token %d after #%d %s under token %d", w.Lane, w.Seq, w.Op, w.Token, prev.Seq, prev.Op, prev.Token)
		}
		last[w.Lane] = w
	}
}

// checkTerms checks the writes against the term log, in the order the
// database gave both (the counter row every write and every term change
// locks): each committed write's token is that of the latest term granted
// before it; a fenced write (which Fence or the tip's guard held) never
// follows the release of its term; the log's tokens never go down; and no
// token was given to two holders or two instances of one (a process
// restarted within its TTL takes a new token, not its old one).
func checkTerms(fs *finalState, ops map[string]*writeOp, res *result) {
	res.TermChanges = len(fs.Terms)
	type entry struct {
		seq   int64
		write *dbWrite
		term  *dbTerm
	}
	ws := slices.Concat(fs.Writes, fs.LaneWrites)
	es := make([]entry, 0, len(ws)+len(fs.Terms))
	for i := range ws {
		es = append(es, entry{seq: ws[i].Seq, write: &ws[i]})
	}
	for i := range fs.Terms {
		es = append(es, entry{seq: fs.Terms[i].Seq, term: &fs.Terms[i]})
	}
	slices.SortFunc(es, func(a, b entry) int { return int(a.seq - b.seq) })
	type key struct {
		lane  string
		token int64
	}
	cur := map[string]*dbTerm{}  // per scope ("" the lease, else the lane), the latest change
	holders := map[key]dbTerm{}  // the first holder of each token
	lastHolder := ""             // the holder of the lease's latest term
	reported := map[string]int{} // per kind: the first 20 are listed, then a count
	var kinds []string
	report := func(kind, format string, args ...any) {
		if reported[kind] < 20 {
			res.add(kind, format, args...)
		}
		if reported[kind] == 0 {
			kinds = append(kinds, kind)
		}
		reported[kind]++
	}
	scope := func(lane string) string {
		if lane == "" {
			return "the lease"
		}
		return "lane " + lane
	}
	for _, e := range es {
		if t := e.term; t != nil {
			if c := cur[t.Lane]; c != nil && t.Token < c.Token {
				report(aTermOrder, "%s: the term log has token %d (#%d, %s) after token %d (#%d)", scope(t.Lane), t.Token, t.Seq, t.Holder, c.Token, c.Seq)
			}
			if t.Holder != "" {
				k := key{t.Lane, t.Token}
				if h, ok := holders[k]; !ok {
					holders[k] = *t
				} else if h.Holder != t.Holder || h.Instance != t.Instance {
					report(aTokenReused, "%s: token %d was given to %s (instance %s) at #%d and to %s (instance %s) at #%d",
						scope(t.Lane), t.Token, h.Holder, h.Instance, h.Seq, t.Holder, t.Instance, t.Seq)
				}
			}
			if t.Ended {
				res.TermsEnded++
			}
			if c := cur[t.Lane]; t.Lane == "" && t.Holder != "" && (c == nil || t.Token != c.Token) {
				res.Terms++
				if last := lastHolder; last != "" && last == t.Holder {
					res.Again++
				}
				lastHolder = t.Holder
			}
			cur[t.Lane] = t
			continue
		}
		w := e.write
		style := ""
		if o := ops[w.Op]; o != nil {
			style = o.style
		}
		c := cur[w.Lane]
		switch {
		case c == nil || w.Token > c.Token:
			granted := int64(0)
			if c != nil {
				granted = c.Token
			}
			report(aEarlyCommit, "%s: #%d %s (%s) committed under token %d while the latest token granted was %d", scope(w.Lane), w.Seq, w.Op, style, w.Token, granted)
		case w.Token < c.Token:
			report(aStaleCommit, "%s: #%d %s (%s) committed under token %d after token %d was granted to %s at #%d", scope(w.Lane), w.Seq, w.Op, style, w.Token, c.Token, c.Holder, c.Seq)
		case c.Ended && (fenced(style) || style == styleLane):
			report(aAfterRelease, "%s: #%d %s (%s) committed under token %d after its term was released at #%d", scope(w.Lane), w.Seq, w.Op, style, w.Token, c.Seq)
		}
	}
	for _, k := range kinds {
		if n := reported[k]; n > 20 {
			res.add(k, "and %d more", n-20)
		}
	}
}

// checkChain verifies the audit chain from its first row, that each row
// is a committed write's, and that the tip names the last row.
func checkChain(fs *finalState, ops map[string]*writeOp, res *result) {
	res.ChainRows = len(fs.Audit)
	var prev []byte
	bySeq := map[int64]dbWrite{}
	for _, w := range fs.Writes {
		bySeq[w.Seq] = w
	}
	var lastToken int64
	for i, a := range fs.Audit {
		if a.Counter != int64(i+1) {
			res.add(aChainBroken, "audit row %d has counter %d", i+1, a.Counter)
			return
		}
		sum := sha256.Sum256(append(append([]byte{}, prev...), a.Payload...))
		if !bytes.Equal(sum[:], a.Hash) {
			res.add(aChainBroken, "audit row %d: hash %x, want %x", a.Counter, prefix8(a.Hash), prefix8(sum[:]))
			return
		}
		prev = a.Hash
		parts := strings.Split(a.Payload, "|")
		if len(parts) != 3 {
			res.add(aChainBroken, "audit row %d: payload %q", a.Counter, a.Payload)
			return
		}
		tok, _ := strconv.ParseInt(parts[1], 10, 64)
		seq, _ := strconv.ParseInt(parts[2], 10, 64)
		if w, ok := bySeq[seq]; !ok || w.Op != parts[0] || w.Token != tok {
			res.add(aChainBroken, "audit row %d (%q) does not match write #%d", a.Counter, a.Payload, seq)
		}
		lastToken = tok
	}
	switch {
	case fs.Tip == nil && len(fs.Audit) > 0:
		res.add(aChainBroken, "the chain has %d rows and no tip", len(fs.Audit))
	case fs.Tip == nil:
	case fs.Tip.Counter != int64(len(fs.Audit)) || !bytes.Equal(fs.Tip.Hash, prev):
		res.add(aChainBroken, "the tip is at %d (%x) but the chain ends at %d (%x)", fs.Tip.Counter, prefix8(fs.Tip.Hash), len(fs.Audit), prefix8(prev))
	case fs.Tip.Token != lastToken:
		res.add(aChainBroken, "the tip was written under token %d but its row under %d", fs.Tip.Token, lastToken)
	}
}

func prefix8(b []byte) []byte { return b[:min(len(b), 8)] }

// checkGrants: each token is granted once, a grant that completed before
// another began has the lower token, and nothing was granted above the
// database's high-water mark, which the lease row's token equals.
func checkGrants(fs *finalState, grants []grant, res *result) {
	byToken := map[uint64]grant{}
	for _, g := range grants {
		if o, dup := byToken[g.token]; dup {
			res.add(aDuplicateGrant, "token %d granted to %s (%s) and to %s (%s)", g.token, o.proc, o.what, g.proc, g.what)
		}
		byToken[g.token] = g
		if int64(g.token) > fs.HighWater {
			res.add(aGrantAboveMark, "token %d granted to %s above the high-water mark %d", g.token, g.proc, fs.HighWater)
		}
	}
	for _, a := range grants {
		for _, b := range grants {
			if a.token < b.token && b.to < a.from {
				res.add(aGrantOrder, "token %d (%s) was granted at %s, before token %d (%s) was asked for at %s",
					b.token, b.proc, sec(b.to), a.token, a.proc, sec(a.from))
			}
		}
	}
	if fs.LeaseToken != fs.HighWater {
		res.add(aGrantAboveMark, "the lease row's token is %d but the high-water mark is %d", fs.LeaseToken, fs.HighWater)
	}
}

// checkLinearizable runs porcupine over the grants and the writes that
// took effect.
func checkLinearizable(ops map[string]*writeOp, grants []grant, present map[string]dbWrite, in checkInput, res *result) {
	var hist []porcupine.Operation
	procIdx := map[string]int{}
	client := func(p string) int {
		if i, ok := procIdx[p]; ok {
			return i
		}
		procIdx[p] = len(procIdx)
		return procIdx[p]
	}
	for _, g := range grants {
		hist = append(hist, porcupine.Operation{ClientId: client(g.proc), Input: regInput{grant: true, token: g.token, op: g.proc}, Call: g.from, Return: g.to})
	}
	after := in.end + int64(time.Second)
	for _, o := range sortedOps(ops) {
		if o.lane != "" {
			continue // lanes have tokens of their own: checkTerms orders them
		}
		w, ok := present[o.id]
		switch {
		case o.outcome == kOK:
			hist = append(hist, porcupine.Operation{ClientId: client(o.proc), Input: regInput{token: o.token, seq: o.seq, op: o.id}, Call: o.call, Return: o.ret})
		case o.outcome != kFail && ok:
			// Committed at a moment we do not know: its row tells its
			// token and number.
			hist = append(hist, porcupine.Operation{ClientId: client(o.proc), Input: regInput{token: uint64(w.Token), seq: w.Seq, op: o.id}, Call: o.call, Return: after})
		}
	}
	res.Linearized = len(hist)
	t0 := time.Now()
	r := porcupine.CheckOperationsTimeout(registerModel, hist, 2*time.Minute)
	res.CheckTime = time.Since(t0)
	switch r {
	case porcupine.Illegal:
		detail := "no order of the grants and committed writes satisfies the fenced-register model"
		if _, info := porcupine.CheckOperationsVerbose(registerModel, hist, time.Minute); in.dir != "" {
			path := filepath.Join(in.dir, "linearizability-"+string(in.dialect)+".html")
			if f, err := os.Create(path); err == nil {
				if porcupine.Visualize(registerModel, info, f) == nil {
					detail += "; see " + path
				}
				f.Close()
			}
		}
		res.add(aLinearizability, "%s", detail)
	case porcupine.Unknown:
		res.add(aCheckTimeout, "porcupine gave up after %v on %d operations", res.CheckTime.Round(time.Second), len(hist))
	}
}

// checkBeliefs: no two processes believed they led at overlapping times,
// unless the earlier term was ended by an operator (forced: by when its
// holder's belief must have ended), whose holder believes until its next
// renew fails.
func checkBeliefs(bs []belief, forced map[uint64]int64, res *result) {
	excused := func(old, cur belief) bool {
		end, ok := forced[old.token]
		return ok && cur.token > old.token && old.to <= end+int64(beliefSlack)
	}
	sorted := slices.Clone(bs)
	slices.SortFunc(sorted, func(a, b belief) int { return int(a.from - b.from) })
	res.MinGap = -1
	reported := 0
	for i, a := range sorted {
		for _, b := range sorted[i+1:] {
			if b.proc == a.proc || excused(a, b) || excused(b, a) {
				continue
			}
			gap := b.from - a.to
			if res.MinGap < 0 || time.Duration(gap) < res.MinGap {
				res.MinGap = time.Duration(gap)
			}
			if gap < -int64(beliefSlack) {
				if reported < 20 {
					res.add(aOverlap, "%s (token %d, %s–%s) and %s (token %d, %s–%s) both believed they led for %v",
						a.proc, a.token, sec(a.from), sec(a.to), b.proc, b.token, sec(b.from), sec(b.to), time.Duration(min(a.to, b.to)-b.from).Round(time.Microsecond))
				}
				reported++
			}
			if b.from > a.to {
				break // sorted by from: later ones start later still
			}
		}
	}
	if reported > 20 {
		res.add(aOverlap, "and %d more overlaps", reported-20)
	}
}

// checkRecovery: after each heal, some process believes it leads within
// LeaseTTL + 2 heartbeats. A heal at which a process already believed
// counts as recovered at once and is not in the recovery distribution.
func checkRecovery(bs []belief, in checkInput, res *result) {
	bound := in.timings.TTL + 2*in.timings.Heartbeat
	for _, f := range in.faults {
		h := f.End
		res.Heals++
		led := false
		next := int64(-1)
		for _, b := range bs {
			if b.from <= h && h <= b.to {
				led = true
				break
			}
			if b.from > h && (next < 0 || b.from < next) {
				next = b.from
			}
		}
		if led {
			continue
		}
		if next < 0 {
			if in.end-h > int64(bound) {
				res.add(aSlowRecovery, "no leader after the heal of %s on %s at %s, to the end of the run", f.Kind, f.Node, sec(h))
			}
			continue
		}
		d := time.Duration(next - h)
		res.Recovery = append(res.Recovery, d)
		if d > bound {
			res.add(aSlowRecovery, "a leader %v after the heal of %s on %s at %s (bound %v)", d.Round(time.Millisecond), f.Kind, f.Node, sec(h), bound)
		}
	}
}

func sec(t int64) string { return fmt.Sprintf("%.3fs", float64(t)/1e9) }

// checkMargin checks the promise behind the trust window: a term that
// expired (its holder did not release it) is granted to the next holder
// no sooner than LeaseTTL - FenceTimeout after its holder stopped
// believing it led. A grant's record ends when the grant was done, so the
// grant itself came no later: a record that ends sooner than the margin
// after the belief is a violation for certain, and the measured gap is an
// upper bound of the true one. A belief recorded ends at its last sample,
// at most one sampling period before it really ended, which only makes
// the measured gap larger. Terms whose predecessor was released are left
// out on PostgreSQL: there a release hands the next term over, trusted
// for a share of what is left of it, with no fixed margin.
func checkMargin(bs []belief, gs []grant, released map[uint64]bool, in checkInput, res *result) {
	res.Margin = in.timings.TTL - in.timings.FenceTimeout
	end := map[uint64]belief{} // the latest belief under each token
	for _, b := range bs {
		if e, ok := end[b.token]; !ok || b.to > e.to {
			end[b.token] = b
		}
	}
	done := map[uint64]grant{} // the earliest completion of each token's grants
	var tokens []uint64
	for _, g := range gs {
		if d, ok := done[g.token]; !ok || g.to < d.to {
			if !ok {
				tokens = append(tokens, g.token)
			}
			done[g.token] = g
		}
	}
	slices.Sort(tokens)
	ended := make([]uint64, 0, len(end))
	for t := range end {
		ended = append(ended, t)
	}
	slices.Sort(ended)
	reported := 0
	for _, t := range ended {
		b := end[t]
		if released[t] || in.dialect == cluster.Postgres && released[t-1] {
			continue
		}
		i, found := slices.BinarySearch(tokens, t+1)
		if !found && i == len(tokens) {
			continue // no later grant recorded
		}
		g := done[tokens[i]]
		gap := time.Duration(g.to - b.to)
		res.Margins++
		if res.Margins == 1 || gap < res.MinMargin {
			res.MinMargin = gap
		}
		if gap < res.Margin-beliefSlack {
			if reported < 20 {
				res.add(aMargin, "%s believed it led under token %d until %s; token %d was granted to %s by %s, %v later (the margin is %v)",
					b.proc, t, sec(b.to), g.token, g.proc, sec(g.to), gap.Round(time.Microsecond), res.Margin)
			}
			reported++
		}
	}
	if reported > 20 {
		res.add(aMargin, "and %d more terms granted within the margin", reported-20)
	}
}

// checkConfig checks the config version, a counter every node bumps: the
// bumps acknowledged returned distinct versions, each above that of every
// bump that returned before it began (a linearizable counter); the final
// version is at least the acknowledged count and the highest version
// returned (none lost), and at most the bumps invoked (none made up).
func checkConfig(in checkInput, res *result) {
	type bump struct {
		proc     string
		from, to int64
		v        int64
	}
	var ok []bump
	for p, rs := range in.histories {
		for _, r := range rs {
			if r.Kind != kBump {
				continue
			}
			if r.What == "call" {
				res.Bumps++
			}
			if r.What == "ok" {
				ok = append(ok, bump{p, r.From, r.To, r.Seq})
			}
		}
	}
	res.BumpsOK = len(ok)
	if in.final != nil {
		res.ConfigVersion = in.final.ConfigVersion
	}
	if res.Bumps == 0 {
		return
	}
	reported := 0
	report := func(kind, format string, args ...any) {
		if reported < 20 {
			res.add(kind, format, args...)
		}
		reported++
	}
	seen := map[int64]bump{}
	var highest int64
	for _, b := range ok {
		if o, dup := seen[b.v]; dup {
			report(aConfigRepeat, "config version %d was returned to a bump of %s (%s-%s) and one of %s (%s-%s)", b.v, o.proc, sec(o.from), sec(o.to), b.proc, sec(b.from), sec(b.to))
		}
		seen[b.v] = b
		highest = max(highest, b.v)
	}
	byCall := slices.Clone(ok)
	slices.SortFunc(byCall, func(a, b bump) int { return int(a.from - b.from) })
	byReturn := slices.Clone(ok)
	slices.SortFunc(byReturn, func(a, b bump) int { return int(a.to - b.to) })
	var before bump // the highest version among the bumps returned so far
	j := 0
	for _, b := range byCall {
		for ; j < len(byReturn) && byReturn[j].to < b.from; j++ {
			if byReturn[j].v > before.v {
				before = byReturn[j]
			}
		}
		if before.v > 0 && b.v <= before.v {
			report(aConfigRepeat, "a bump of %s began at %s, after one of %s had returned version %d, and returned %d", b.proc, sec(b.from), before.proc, before.v, b.v)
		}
	}
	if in.final == nil {
		return
	}
	final := in.final.ConfigVersion
	if final < highest || final < int64(len(ok)) {
		report(aConfigLost, "the database's config version is %d; bumps returned versions up to %d, %d of them acknowledged", final, highest, len(ok))
	}
	if final > int64(res.Bumps) {
		report(aConfigPhantom, "the database's config version is %d, above the %d bumps invoked", final, res.Bumps)
	}
	if reported > 20 {
		res.add(aConfigRepeat, "and %d more config-version anomalies", reported-20)
	}
}
