package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// report prints one experiment's results as a Jepsen-style summary.
func report(w io.Writer, r *result) {
	fmt.Fprintf(w, "operations  %d writes: %s; %d stale writes (%d committed while their token was still current); %d grants; %d belief intervals\n",
		r.Writes, counts(r.Outcomes, "ok", "refused", "error", "info-committed", "info-absent"), r.StaleWrites, r.StaleOK, r.Grants, r.Beliefs)
	fmt.Fprintf(w, "workloads   %s\n", workloadLine(r))
	fmt.Fprintf(w, "database    %d rows in commit order, %d in the audit chain, %d lane rows; %d changes in the term log (%d ended a term or claim early; %d terms of the lease, %d won by the node that held the one before)\n", r.Rows, r.ChainRows, r.LaneRows, r.TermChanges, r.TermsEnded, r.Terms, r.Again)
	fmt.Fprintf(w, "faults      %d: %s\n", len(r.FaultList), counts(r.Faults, allFaults...))
	fmt.Fprintf(w, "recovery    %s (bound LeaseTTL + 2 heartbeats = %v; %d heals, the others had a leader already)\n",
		recoveryLine(r.Recovery), r.Timings.TTL+2*r.Timings.Heartbeat, r.Heals)
	fmt.Fprintf(w, "failover    %s\n", durations(r.Failovers, "faults that ended the leader's belief, to the next leader"))
	if r.Faults[faultResign] > 0 {
		fmt.Fprintf(w, "handoff     %s\n", durations(r.Handoffs, "resigns, to the next leader"))
	}
	if r.Stack == stackPgx {
		fmt.Fprintf(w, "listening   %d processes (incarnations) heard releases\n", r.Hearing)
	}
	fmt.Fprintf(w, "leaderless  %s\n", gapLine(r.Gaps))
	if r.LongestGap != "" {
		fmt.Fprintf(w, "            longest: %s\n", r.LongestGap)
	}
	gap := "none measured"
	if r.MinGap >= 0 {
		gap = r.MinGap.Round(time.Microsecond).String()
	}
	fmt.Fprintf(w, "beliefs     smallest gap between two processes' beliefs: %s\n", gap)
	fmt.Fprintf(w, "margin      %s\n", marginLine(r))
	fmt.Fprintf(w, "config      %d bumps (%d acknowledged); the database's version at the end: %d\n", r.Bumps, r.BumpsOK, r.ConfigVersion)
	fmt.Fprintf(w, "porcupine   %d operations checked in %v\n", r.Linearized, r.CheckTime.Round(time.Millisecond))
	writeAnomalies(w, r.Anomalies)
}

// counts prints m's entries, the named keys first in that order.
func counts(m map[string]int, order ...string) string {
	var parts []string
	seen := map[string]bool{}
	for _, k := range order {
		seen[k] = true
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	var rest []string
	for k := range m {
		if !seen[k] && m[k] > 0 {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func recoveryLine(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no heal found the cluster without a leader"
	}
	return durations(ds, "heals without a leader")
}

func gapLine(ds []time.Duration) string {
	if len(ds) == 0 {
		return "never, after the first leader"
	}
	return durations(ds, "intervals without a leader")
}

// markdown writes the results as one Jepsen-style table per dialect, for
// RELIABILITY.md.
func markdown(w io.Writer, command string, rs []*result) {
	fmt.Fprintf(w, "```sh\n%s\n```\n\n", command)
	for _, r := range rs {
		fmt.Fprintf(w, "#### %s: seed %d, %v of faults, %d nodes%s\n\n", r.label(), r.Seed, r.Duration, r.Nodes, mutantNote(r.Mutant))
		fmt.Fprintf(w, "| | kind | value |\n| --- | --- | ---: |\n")
		row := func(section, kind string, n any) { fmt.Fprintf(w, "| %s | %s | %v |\n", section, kind, n) }
		row("operations", "writes invoked", r.Writes)
		for _, k := range []string{"ok", "refused", "error", "info-committed", "info-absent"} {
			row("", outcomeNames[k], r.Outcomes[k])
		}
		row("", "stale writes (under an ended term's token, without Fence)", fmt.Sprintf("%d (%d committed while their token was still current)", r.StaleWrites, r.StaleOK))
		row("", "grants observed", r.Grants)
		row("", "belief intervals", r.Beliefs)
		row("", "workloads: invoked (acknowledged)", workloadLine(r))
		row("", "rows in commit order / in the audit chain / lane rows", fmt.Sprintf("%d / %d / %d", r.Rows, r.ChainRows, r.LaneRows))
		row("", "term log: changes (early ends)", fmt.Sprintf("%d (%d)", r.TermChanges, r.TermsEnded))
		row("", "terms of the lease (won by the previous term's node)", fmt.Sprintf("%d (%d)", r.Terms, r.Again))
		first := "faults"
		for _, k := range allFaults {
			if r.Faults[k] > 0 {
				row(first, k, r.Faults[k])
				first = ""
			}
		}
		if first != "" {
			row(first, "none", 0)
		}
		byKind := map[string]int{}
		for _, a := range r.Anomalies {
			byKind[a.Kind]++
		}
		if len(byKind) == 0 {
			row("anomalies", "none", 0)
		} else {
			first = "anomalies"
			for _, k := range slices.Sorted(maps.Keys(byKind)) {
				row(first, k, byKind[k])
				first = ""
			}
		}
		row("recovery", fmt.Sprintf("after a heal with no leader (bound %v)", r.Timings.TTL+2*r.Timings.Heartbeat), recoveryLine(r.Recovery))
		row("", "failover: from a fault that ended the leader's belief to the next belief", durations(r.Failovers, "faults"))
		if r.Faults[faultResign] > 0 {
			row("", "handoff: from a resign to the next belief", durations(r.Handoffs, "resigns"))
		}
		if r.Stack == stackPgx {
			row("", "processes (incarnations) that heard releases", r.Hearing)
		}
		row("", "intervals without a leader", gapLine(r.Gaps))
		if r.LongestGap != "" {
			row("", "the longest", r.LongestGap)
		}
		gap := "none measured"
		if r.MinGap >= 0 {
			gap = r.MinGap.Round(time.Microsecond).String()
		}
		row("", "smallest gap between two processes' beliefs", gap)
		row("", "smallest gap from a belief's end to the next term's grant (expired terms)", marginLine(r))
		row("", "config-version bumps (acknowledged), version at the end", fmt.Sprintf("%d (%d), %d", r.Bumps, r.BumpsOK, r.ConfigVersion))
		row("", "porcupine", fmt.Sprintf("%d operations in %v", r.Linearized, r.CheckTime.Round(time.Millisecond)))
		fmt.Fprintln(w)
	}
}

var outcomeNames = map[string]string{
	"ok":             "acknowledged (ok)",
	"refused":        "refused by the library or the database (fail)",
	"error":          "failed before COMMIT otherwise (fail)",
	"info-committed": "unknown outcome, row present (info)",
	"info-absent":    "unknown outcome, row absent (info)",
}

func durations(ds []time.Duration, what string) string {
	if len(ds) == 0 {
		return "none measured"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("%d %s: p50 %v, p99 %v, max %v", len(s), what,
		q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// writeAnomalies writes the anomalies line of a summary: "none", or the
// count by kind and the first 30, one per line.
func writeAnomalies(w io.Writer, as []anomaly) {
	if len(as) == 0 {
		fmt.Fprintf(w, "anomalies   none\n")
		return
	}
	byKind := map[string]int{}
	for _, a := range as {
		byKind[a.Kind]++
	}
	fmt.Fprintf(w, "anomalies   %d: %s\n", len(as), counts(byKind))
	for i, a := range as {
		if i == 30 {
			fmt.Fprintf(w, "  ... and %d more\n", len(as)-30)
			break
		}
		fmt.Fprintf(w, "  %s: %s\n", a.Kind, a.Detail)
	}
}

// marginLine is the smallest belief-to-grant gap against the promised
// margin, LeaseTTL - FenceTimeout.
func marginLine(r *result) string {
	if r.Margins == 0 {
		return fmt.Sprintf("no expired term was followed by a grant (promised at least %v)", r.Margin)
	}
	return fmt.Sprintf("smallest %v from a belief's end to the next term's grant, over %d expired terms (promised at least %v)",
		r.MinMargin.Round(time.Millisecond), r.Margins, r.Margin)
}

// workloadLine is the operations of each workload, invoked and
// acknowledged: fenced writes with the chain, plain fenced writes, lane
// writes, stale writes, and config-version bumps.
func workloadLine(r *result) string {
	names := map[string]string{styleFenced: "fenced+chain", stylePlain: "fenced", styleLane: "lane", styleStaleTip: "stale-tip", styleUnfenced: "unfenced"}
	var parts []string
	for _, s := range []string{styleFenced, stylePlain, styleLane, styleStaleTip, styleUnfenced} {
		if r.Styles[s] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d (%d)", names[s], r.Styles[s], r.StylesOK[s]))
		}
	}
	parts = append(parts, fmt.Sprintf("config bumps %d (%d)", r.Bumps, r.BumpsOK))
	return strings.Join(parts, ", ")
}
