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
		if m.Old == m.New || strings.Contains(m.Old, "\n") != strings.Contains(m.New, "\n") {
			t.Errorf("mutant %s changes nothing, or more than its line", m.Name)
		}
		if err := plantCheck(m); err != nil {
			t.Error(err)
		}
	}
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
	for _, m := range libMutants {
		t.Run(m.Name, func(t *testing.T) {
			d, _, _ := strings.Cut(m.Stack, "+")
			if _, ok := dsns[cluster.Dialect(d)]; !ok {
				t.Skipf("needs %s", d)
			}
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
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
