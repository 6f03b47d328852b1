package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
)

// pool pools the trials of several runs' result files (compare's
// handoff.json or takeover.json, each run written with an -out of its
// own) by system, and prints their percentiles: the tables that quote
// "the trials of these runs together".
//
//	go run . pool /tmp/f1/handoff.json /tmp/f2/handoff.json ...
func pool(args []string) error {
	fs := flag.NewFlagSet("pool", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run . pool <handoff.json or takeover.json of a run> ...")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("pool: no result file given")
	}
	p, err := poolFiles(fs.Args())
	if err != nil {
		return err
	}
	fmt.Printf("%s, the trials of %d files together (ms)\n\n", p.kind, fs.NArg())
	fmt.Println("| system | runs | trials | p50 | p90 | p99 | max |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, name := range p.systems {
		s := summarize(p.trials[name])
		fmt.Printf("| %s | %d | %d | %s | %s | %s | %s |\n", name, p.runs[name], s.N, fmtMs(s.P50), fmtMs(s.P90), fmtMs(s.P99), fmtMs(s.Max))
	}
	return nil
}

// pooled is the trials of several result files, by system.
type pooled struct {
	kind    trialKind
	systems []string             // sorted
	trials  map[string][]float64 // ms
	runs    map[string]int       // the files that had the system
}

// poolFiles reads compare's result files, all of one kind of trial.
func poolFiles(files []string) (pooled, error) {
	p := pooled{trials: map[string][]float64{}, runs: map[string]int{}}
	for _, f := range files {
		var r trialsResult
		if err := readJSON(f, &r); err != nil {
			return pooled{}, fmt.Errorf("pool: %s: %w", f, err)
		}
		if p.kind != "" && r.Kind != p.kind {
			return pooled{}, fmt.Errorf("pool: %s holds %s trials, the files before it %s trials", f, r.Kind, p.kind)
		}
		p.kind = r.Kind
		for _, s := range r.Systems {
			if _, seen := p.trials[s.System]; !seen {
				p.systems = append(p.systems, s.System)
			}
			for _, t := range s.Trials {
				p.trials[s.System] = append(p.trials[s.System], t.Ms)
			}
			p.runs[s.System]++
		}
	}
	slices.Sort(p.systems)
	return p, nil
}
