package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// traces splits the handoffs of a traced compare run (BENCH_TRACE=1, its
// standard error saved to a file) into their steps, per system, and
// prints the medians: how the milliseconds of the tables that quote a
// trace were counted.
//
//	BENCH_TRACE=1 go run . compare -only handoff -systems pgx -pg-handoff notify 2>trace.txt
//	go run . traces trace.txt
//
// A handoff starts at a member's "release ok start" line (its "shutdown
// call start" just before, when there is one, is the call); the successor
// is the first other member of the same system whose acquisition ("acquire
// ok": a grant, or the take-up of a term handed over) starts after it and
// ends within -window, and the handoff ends at that member's "acquired
// event" line, when it leads.
func traces(args []string) error {
	fs := flag.NewFlagSet("traces", flag.ContinueOnError)
	window := fs.Duration("window", 50*time.Millisecond, "longest time from a release's start to the successor's lead that counts as its handoff")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run . traces [flags] <file of trace lines, or - for standard input>")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("traces: one file expected")
	}
	in := io.Reader(os.Stdin)
	if name := fs.Arg(0); name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	lines, err := readTraces(in)
	if err != nil {
		return err
	}
	splits := splitHandoffs(lines, *window)
	if len(splits) == 0 {
		return errors.New("traces: no handoff found (were the lines written with BENCH_TRACE=1?)")
	}
	fmt.Println("| system | handoffs | call to release | release | release end to successor's start | successor's statement | successor's statement end to leading | release start to leading | call to leading |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	systems := make([]string, 0, len(splits))
	for s := range splits {
		systems = append(systems, s)
	}
	slices.Sort(systems)
	for _, s := range systems {
		hs := splits[s]
		med := func(f func(handoffSplit) time.Duration) string {
			v := make([]float64, len(hs))
			for i, h := range hs {
				v[i] = ms(f(h))
			}
			return fmt.Sprintf("%.2f", median(v))
		}
		fmt.Printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", s, len(hs),
			med(func(h handoffSplit) time.Duration { return h.release.Sub(h.call) }),
			med(func(h handoffSplit) time.Duration { return h.released.Sub(h.release) }),
			med(func(h handoffSplit) time.Duration { return h.took.Sub(h.released) }),
			med(func(h handoffSplit) time.Duration { return h.taken.Sub(h.took) }),
			med(func(h handoffSplit) time.Duration { return h.leads.Sub(h.taken) }),
			med(func(h handoffSplit) time.Duration { return h.leads.Sub(h.release) }),
			med(func(h handoffSplit) time.Duration { return h.leads.Sub(h.call) }))
	}
	fmt.Println("\nmedians in ms; a step that overlaps the one before it is negative (the successor's process heard the release before the leader's did)")
	return nil
}

// traceLine is one line a member wrote: "trace <unixnano> <member> <what>".
type traceLine struct {
	at     time.Time
	member string
	what   string
}

func readTraces(r io.Reader) ([]traceLine, error) {
	var out []traceLine
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[0] != "trace" {
			continue // the run's own output, interleaved
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("traces: line %q: %w", sc.Text(), err)
		}
		out = append(out, traceLine{time.Unix(0, ns), f[2], strings.Join(f[3:], " ")})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	// Members write their lines from several goroutines and processes.
	slices.SortStableFunc(out, func(a, b traceLine) int { return a.at.Compare(b.at) })
	return out, nil
}

// handoffSplit is the times of one handoff's steps.
type handoffSplit struct {
	call, release, released time.Time // the leader's
	took, taken, leads      time.Time // the successor's statement, and its lead
}

// systemOf is the system a member's name belongs to: "pgx-1-g3" is pgx's.
func systemOf(member string) string {
	i := strings.LastIndex(member, "-")
	if i < 0 {
		return member
	}
	j := strings.LastIndex(member[:i], "-")
	if j < 0 {
		return member[:i]
	}
	return member[:j]
}

// splitHandoffs finds the handoffs in lines, sorted by time, per system.
func splitHandoffs(lines []traceLine, window time.Duration) map[string][]handoffSplit {
	out := map[string][]handoffSplit{}
	for i, l := range lines {
		if l.what != "release ok start" {
			continue
		}
		h := handoffSplit{call: l.at, release: l.at}
		for k := i - 1; k >= 0 && l.at.Sub(lines[k].at) < window; k-- {
			if lines[k].member == l.member && lines[k].what == "shutdown call start" {
				h.call = lines[k].at
				break
			}
		}
		successor := ""
		for _, m := range lines[i+1:] {
			if m.at.Sub(l.at) > window {
				break
			}
			switch {
			case m.member == l.member && m.what == "release ok end" && h.released.IsZero():
				h.released = m.at
			case successor == "" && m.member != l.member && systemOf(m.member) == systemOf(l.member) && m.what == "acquire ok start":
				successor, h.took = m.member, m.at
			case m.member == successor && m.what == "acquire ok end" && h.taken.IsZero():
				h.taken = m.at
			case m.member == successor && m.what == "acquired event x" && h.leads.IsZero():
				h.leads = m.at
			}
		}
		if h.released.IsZero() || h.taken.IsZero() || h.leads.IsZero() {
			continue // no successor within the window (a trial's last release, or a takeover)
		}
		s := systemOf(l.member)
		out[s] = append(out[s], h)
	}
	return out
}
