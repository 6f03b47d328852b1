package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/sqlfence/cluster"
)

// table returns an aligned writer on stdout; Flush it.
func (e *env) table() *tabwriter.Writer {
	return tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
}

// printJSON prints v as one indented JSON document.
func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// stamp formats a time read from the database, in UTC to the millisecond.
func stamp(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// span formats a duration at a precision fit for its size: 850ms, 4.2s,
// 1m5s.
func span(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + span(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// prefix returns the first n bytes of s.
func prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// memberJSON is a member as -json prints it: the library's Member JSON
// (nodeId, instance, host, pid, endpoint, startedAt, lastSeen, status,
// live, leader), how long ago the database last saw it, by the clock of
// the same read that decided live, and the node timeout live was judged
// by (the member's own, or -node-timeout for a row that recorded none).
type memberJSON struct {
	cluster.Member
	LastSeenAgoMs int64 `json:"lastSeenAgoMs"`
	TimeoutMs     int64 `json:"timeoutMs"`
}

func (e *env) membersJSON(ms []cluster.Member) []memberJSON {
	out := make([]memberJSON, 0, len(ms))
	for _, m := range ms {
		m.StartedAt, m.LastSeen = m.StartedAt.UTC(), m.LastSeen.UTC()
		out = append(out, memberJSON{Member: m, LastSeenAgoMs: m.SeenAgo.Milliseconds(), TimeoutMs: e.judgedBy(m).Milliseconds()})
	}
	return out
}

// judgedBy is the node timeout m's liveness was judged by.
func (e *env) judgedBy(m cluster.Member) time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return e.opts.nodeTimeout
}

// printMembers prints the members as a table.
func (e *env) printMembers(ms []cluster.Member) error {
	if len(ms) == 0 {
		_, err := fmt.Fprintf(e.stdout, "no members of lease %q recorded\n", e.opts.lease)
		return err
	}
	w := e.table()
	fmt.Fprintln(w, "NODE\tINSTANCE\tHOST\tPID\tSTATUS\tLIVE\tLEADER\tLAST SEEN\tTIMEOUT")
	for _, m := range ms {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s ago\t%s\n", m.NodeID, prefix(m.Instance, 8), orDash(m.Host), m.PID,
			m.Status, yesNo(m.Live), yesNo(m.Leader), span(m.SeenAgo), span(e.judgedBy(m)))
	}
	return w.Flush()
}
