package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// A libMutant is a one-line bug planted in the library, never in this
// module: the line Old of File (from the repository root), which must
// occur there exactly once, becomes New. TestLibraryMutants builds this
// program against the mutated library and runs the experiment on Stack
// with Faults (the stack's defaults when empty) and Seed; the checker must
// find an anomaly. A mutant the experiment cannot reach is listed in
// RELIABILITY.md with the unit test that catches it, not here.
type libMutant struct {
	Name   string
	File   string
	Old    string
	New    string
	Stack  string   // an experiment's -dialects value: sqlite, postgres, postgres+pgx, mysql
	Faults []string // -faults
	Seed   uint64
	// Duration is the experiment's (20s when zero): longer for a bug that
	// shows in one fault of several.
	Duration time.Duration
	Why      string // the bug, as a reviewer would miss it
}

// libMutants are the planted bugs. Each is a change a reviewer could miss.
// Those tried and not caught (a guard that a second one masks, a corner the
// nemesis does not reach yet) are listed in RELIABILITY.md with why.
var libMutants = []libMutant{
	{
		Name:  "trust-ttl",
		File:  "lease.go",
		Old:   "case err == nil && now < until && t.until.CompareAndSwap(until, monoAfter(start, c.cfg.FenceTimeout)):",
		New:   "case err == nil && now < until && t.until.CompareAndSwap(until, monoAfter(start, c.cfg.LeaseTTL)):",
		Stack: "postgres", Faults: []string{faultPartition}, Seed: 18,
		Why: "a renew extends the belief by LeaseTTL instead of FenceTimeout: no overlap (the database counts the TTL from later), but no margin either",
	},
	{
		Name:  "trust-ttl-pgx",
		File:  "lease.go",
		Old:   "case err == nil && now < until && t.until.CompareAndSwap(until, monoAfter(start, c.cfg.FenceTimeout)):",
		New:   "case err == nil && now < until && t.until.CompareAndSwap(until, monoAfter(start, c.cfg.LeaseTTL)):",
		Stack: "postgres+pgx", Faults: []string{faultPartition}, Seed: 20,
		Why: "the same, through clusterpgx, whose followers LISTEN",
	},
	{
		Name:  "pg-config-bump",
		File:  "schema/postgres_queries.sql",
		Old:   "    config_version = k.config_version + 1,",
		New:   "    config_version = k.config_version,",
		Stack: "postgres", Faults: []string{faultKill}, Seed: 21,
		Why: "PostgreSQL's config bump upserts the row without incrementing it: every bump after the first returns the same version",
	},
	{
		Name:  "sqlite-config-bump",
		File:  "schema/sqlite_queries.sql",
		Old:   "    config_version = config_version + 1,",
		New:   "    config_version = config_version,",
		Stack: "sqlite", Faults: []string{faultKill}, Seed: 22,
		Why: "SQLite's config bump, the same",
	},
}

// skipDirs are the directories of the repository that building this
// program does not need.
var skipDirs = map[string]bool{".git": true, ".ci": true, "bench": true, "examples": true, "cmd": true, "clusterprom": true, "docs": true, "testdata": true}

// plant copies the repository at root (without what the build does not
// need) to dst and plants m there. It fails when m's line is not in its
// file exactly once: the library moved on, and the mutant must follow.
func plant(root, dst string, m libMutant) error {
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDirs[d.Name()] && rel != "." {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		return err
	}
	path := filepath.Join(dst, filepath.FromSlash(m.File))
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("mutant %s: %w", m.Name, err)
	}
	if n := bytes.Count(b, []byte(m.Old)); n != 1 {
		return fmt.Errorf("mutant %s: the line %q occurs %d times in %s, not once: update the mutant", m.Name, m.Old, n, m.File)
	}
	return os.WriteFile(path, bytes.Replace(b, []byte(m.Old), []byte(m.New), 1), 0o644)
}

// buildMutant plants m in a copy of the repository at root under dir and
// builds this program there, against the mutated library; it returns the
// binary's path.
func buildMutant(ctx context.Context, root, dir string, m libMutant) (string, error) {
	src := filepath.Join(dir, "src")
	if err := plant(root, src, m); err != nil {
		return "", err
	}
	exe := filepath.Join(dir, "chaos-"+m.Name)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", exe, ".")
	cmd.Dir = filepath.Join(src, "chaos")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mutant %s: go build: %v\n%s", m.Name, err, out)
	}
	return exe, nil
}
