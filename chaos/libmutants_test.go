package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// Every planted bug still applies to the library: its line is there,
// once. (Cheap: no build.)
func TestLibraryMutantsApply(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range libMutants {
		if seen[m.Name] {
			t.Errorf("two mutants are named %s", m.Name)
		}
		seen[m.Name] = true
		if oldLines, newLines := strings.Split(m.Old, "\n"), strings.Split(m.New, "\n"); len(oldLines) != len(newLines) {
			t.Errorf("mutant %s adds or removes lines", m.Name)
		} else if changed := countChanged(oldLines, newLines); changed != 1 {
			t.Errorf("mutant %s changes %d lines, not one", m.Name, changed)
		}
		if (m.Test == "") != (m.Unreachable == "") {
			t.Errorf("mutant %s: a unit test (%q) and why the experiment cannot reach it (%q) go together", m.Name, m.Test, m.Unreachable)
		}
		if m.Test != "" && m.Stack != "" {
			t.Errorf("mutant %s names both an experiment (%s) and a unit test: the experiment does not run", m.Name, m.Stack)
		}
		if m.Test == "" && m.Stack == "" {
			t.Errorf("mutant %s names neither the experiment that catches it nor a unit test", m.Name)
		}
		if err := plantCheck(m); err != nil {
			t.Error(err)
		}
	}
}

// countChanged counts the lines that differ between a and b, of one length.
func countChanged(a, b []string) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

// plantCheck checks that m's line occurs once in its file.
func plantCheck(m libMutant) error {
	b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(m.File)))
	if err != nil {
		return err
	}
	if n := strings.Count(string(b), m.Old); n != 1 {
		return &mutantError{m.Name, m.File, n}
	}
	return nil
}

type mutantError struct {
	name, file string
	n          int
}

func (e *mutantError) Error() string {
	return "mutant " + e.name + ": its line occurs " + strconv.Itoa(e.n) + " times in " + e.file + ", not once: update the mutant"
}

// TestLibraryMutants plants each bug of libMutants in a copy of the
// library, builds this program against it and runs the mutant's
// experiment: the checker must find an anomaly. A harness that passes a
// broken library is broken.
func TestLibraryMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs one experiment per mutant")
	}
	dsns := dialects(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// Three at a time: an experiment mostly waits (its nodes sleep between
	// writes and heartbeats), and CI's two cores then stay busy.
	sem := make(chan struct{}, 3)
	for _, m := range libMutants {
		t.Run(m.Name, func(t *testing.T) {
			t.Parallel()
			sem <- struct{}{}
			defer func() { <-sem }()
			d, _, _ := strings.Cut(m.Stack, "+")
			if m.Test != "" {
				d = m.Needs
			}
			if _, ok := dsns[cluster.Dialect(d)]; !ok && d != "" {
				t.Skipf("needs %s", d)
			}
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if m.Test != "" {
				failed, out, err := testMutant(ctx, root, dir, m)
				if err != nil {
					t.Fatal(err)
				}
				if !failed {
					t.Errorf("mutant %s passed %s, the unit test that must catch it (%s)\n%s", m.Name, m.Test, m.Why, out)
				} else {
					t.Logf("mutant %s (%s): caught by %s", m.Name, m.Why, m.Test)
				}
				return
			}
			exe, err := buildMutant(ctx, root, dir, m)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "result.json")
			dur := m.Duration
			if dur == 0 {
				dur = 20 * time.Second
			}
			args := []string{"-duration", dur.String(), "-dialects", m.Stack, "-seed", strconv.FormatUint(m.Seed, 10),
				"-json", out, "-out", filepath.Join(dir, "run")}
			if len(m.Faults) > 0 {
				args = append(args, "-faults", strings.Join(m.Faults, ","))
			}
			cmd := exec.CommandContext(ctx, exe, args...)
			cmd.Env = os.Environ()
			log, _ := cmd.CombinedOutput() // exits 1 when it finds anomalies, as it must here
			var results []result
			b, err := os.ReadFile(out)
			if err == nil {
				err = json.Unmarshal(b, &results)
			}
			if err != nil || len(results) != 1 {
				t.Fatalf("mutant %s: no result (%v); output:\n%s", m.Name, err, log)
			}
			r := results[0]
			kinds := map[string]int{}
			for _, a := range r.Anomalies {
				kinds[a.Kind]++
			}
			t.Logf("mutant %s (%s): %d writes, faults %v, anomalies %v; %s", m.Name, m.Why, r.Writes, r.Faults, kinds, marginLine(&r))
			if len(r.Anomalies) == 0 {
				t.Errorf("mutant %s passed the %s experiment (seed %d, faults %v): %s\n%s", m.Name, m.Stack, m.Seed, m.Faults, m.Why, log)
			}
		})
	}
}
