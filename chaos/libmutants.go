package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// A libMutant is a one-line bug planted in the library, never in this
// module: the text Old of File (from the repository root), which must
// occur there exactly once (it may hold a neighbouring line to say which
// occurrence), becomes New. TestLibraryMutants builds this program against
// the mutated library and runs the experiment on Stack with Faults (the
// stack's defaults when empty) and Seed; the checker must find an anomaly.
// A mutant the experiment cannot reach (a second guard masks it, or the
// corner it needs is not one a fault can make) names instead the library's
// unit test that catches it, which TestLibraryMutants runs against the
// mutated library and which must fail.
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
	// Test, for a mutant the experiment cannot reach, is the unit test of
	// the root package that must fail against it, and Unreachable why the
	// experiment cannot show it.
	Test, Unreachable string
	// Needs is the database a unit-test mutant's test runs on (postgres,
	// mysql; "" for one that needs none): without its DSN the test skips,
	// which would read as a mutant that passed, so the mutant is skipped.
	Needs string
}

// libMutants are the planted bugs. Each is a change a reviewer could miss.
// Those tried and not caught (a guard that a second one masks, a corner the
// nemesis does not reach yet) are listed in RELIABILITY.md with why.
var libMutants = []libMutant{
	// The trust window.
	{
		Name:  "trust-ttl",
		File:  "lease.go",
		Old:   "case err == nil && now < until && c.until.CompareAndSwap(until, monoAfter(start, c.cfg.FenceTimeout)):",
		New:   "case err == nil && now < until && c.until.CompareAndSwap(until, monoAfter(start, c.cfg.LeaseTTL)):",
		Stack: "postgres", Faults: []string{faultPartition}, Seed: 18,
		Why: "a renew extends the belief by LeaseTTL instead of FenceTimeout: no overlap (the database counts the TTL from later), but no margin either",
	},
	{
		Name:  "trust-ttl-pgx",
		File:  "lease.go",
		Old:   "case err == nil && now < until && c.until.CompareAndSwap(until, monoAfter(start, c.cfg.FenceTimeout)):",
		New:   "case err == nil && now < until && c.until.CompareAndSwap(until, monoAfter(start, c.cfg.LeaseTTL)):",
		Stack: "postgres+pgx", Faults: []string{faultPartition}, Seed: 20,
		Why: "the same, through clusterpgx, whose followers LISTEN",
	},
	{
		Name:        "trust-from-answer",
		File:        "lease.go",
		Old:         "case err == nil && now < until && c.until.CompareAndSwap(until, monoAfter(start, c.cfg.FenceTimeout)):",
		New:         "case err == nil && now < until && c.until.CompareAndSwap(until, monoAfter(now, c.cfg.FenceTimeout)):",
		Test:        "TestTrustCountsFromTheRenewsStart",
		Why:         "a renew's trust counts from its answer, not from when it was sent: a slow answer buys belief past the margin",
		Unreachable: "the gain is the renew's one-way delay, and a renew through the proxy takes one or two round trips: a delay long enough to shrink the margin makes the renew miss its window, so slow-cut runs (PostgreSQL, MariaDB, 20 to 40 s) measured margins of 510 to 1,560 ms",
	},
	// Acquire, per dialect.
	{
		Name:  "pg-acquire-token",
		File:  "schema/postgres.sql",
		Old:   "            fencing_token = l.fencing_token + 1,",
		New:   "            fencing_token = l.fencing_token,",
		Stack: "postgres", Faults: []string{faultKill, faultRelease}, Seed: 24,
		Why: "PostgreSQL's acquire keeps the expired term's token: the next holder would fence under its predecessor's token",
	},
	{
		Name:  "mysql-acquire-token",
		File:  "schema/mysql_queries.sql",
		Old:   "LAST_INSERT_ID(fencing_token + 1)",
		New:   "LAST_INSERT_ID(fencing_token)",
		Stack: "mysql", Faults: []string{faultKill, faultRelease}, Seed: 25,
		Why: "MySQL's acquire keeps the expired term's token: the next holder would fence under its predecessor's token",
	},
	{
		Name:  "sqlite-acquire-column",
		File:  "schema/sqlite_queries.sql",
		Old:   "WHERE expires_at <= excluded.acquired_at",
		New:   "WHERE expires_at <= excluded.expires_at",
		Stack: "sqlite", Faults: []string{faultKill}, Seed: 26,
		Why: "SQLite's acquire compares the expiry with the new term's expiry, not with now: every unexpired lease is taken",
	},
	// Renew, per dialect.
	{
		Name:  "pg-renew-from-last",
		File:  "schema/postgres_queries.sql",
		Old:   "UPDATE {{prefix}}lease AS l\nSET renewed_at = c.now_ms, expires_at = c.now_ms + $1::bigint",
		New:   "UPDATE {{prefix}}lease AS l\nSET renewed_at = c.now_ms, expires_at = l.renewed_at + $1::bigint",
		Stack: "postgres", Faults: []string{faultPartition}, Seed: 27, Duration: 40 * time.Second,
		Why: "PostgreSQL's renew counts the new expiry from the previous renew: the lease ends a heartbeat before the leader's trust allows for",
	},
	{
		Name:  "mysql-renew-seconds",
		File:  "schema/mysql_queries.sql",
		Old:   "    expires_at = LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 + ?)",
		New:   "    expires_at = LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP()) DIV 1000 + ?)",
		Stack: "mysql", Faults: []string{faultPartition}, Seed: 28, Duration: 40 * time.Second,
		Why: "MySQL's renew reads the clock to the second: the expiry it writes is up to a second early",
	},
	// The fence, per dialect.
	{
		Name:  "pg-fence-share",
		File:  "schema/postgres_queries.sql",
		Old:   "FOR SHARE;",
		New:   ";",
		Stack: "postgres", Faults: []string{faultRelease}, Seed: 30, Duration: 30 * time.Second,
		Why: "PostgreSQL's fence reads the lease row without locking it: a release (or grant) commits while a fenced write is in flight, which then commits after it",
	},
	{
		Name:  "mariadb-fence-share",
		File:  "schema/mysql_queries.sql",
		Old:   "  AND @@session.idle_readonly_transaction_timeout BETWEEN 0 AND {{seconds}}\nLOCK IN SHARE MODE;",
		New:   "  AND @@session.idle_readonly_transaction_timeout BETWEEN 0 AND {{seconds}}\n;",
		Stack: "mysql", Faults: []string{faultRelease}, Seed: 31, Duration: 30 * time.Second,
		Why: "MariaDB's fence (fence_mariadb, what MariaDB runs), the same",
	},
	{
		Name:  "fence-expiry-grace",
		File:  "provider_db.go",
		Old:   "	case r.expiresAt <= r.now:",
		New:   "	case r.expiresAt+ttl.Milliseconds() <= r.now:",
		Stack: "sqlite", Faults: []string{faultRelease}, Seed: 32,
		Why: "the fence allows a term a TTL's grace after its expiry by the database clock, \"for clock skew\": a term an operator ended is still written under",
	},
	// The config version, per dialect.
	{
		Name:  "pg-config-bump",
		File:  "schema/postgres_queries.sql",
		Old:   "    config_version = k.config_version + 1,",
		New:   "    config_version = k.config_version,",
		Stack: "postgres", Faults: []string{faultKill}, Seed: 21,
		Why: "PostgreSQL's config bump upserts the row without incrementing it: every bump after the first returns the same version",
	},
	{
		Name:  "mysql-config-bump",
		File:  "schema/mysql_queries.sql",
		Old:   "    config_version = LAST_INSERT_ID(config_version + 1),",
		New:   "    config_version = LAST_INSERT_ID(config_version),",
		Stack: "mysql", Faults: []string{faultKill}, Seed: 34,
		Why: "MySQL's config bump, the same",
	},
	{
		Name:  "sqlite-config-bump",
		File:  "schema/sqlite_queries.sql",
		Old:   "    config_version = config_version + 1,",
		New:   "    config_version = config_version,",
		Stack: "sqlite", Faults: []string{faultKill}, Seed: 22,
		Why: "SQLite's config bump, the same",
	},
	// Lanes, per dialect: a claim that takes an expired lane from another
	// member keeps its token when the lane was not released. The lanes'
	// guard refuses the change of hands (SF009), and the library's own
	// statement meeting a guard is an anomaly (guard-refused).
	{
		Name:  "pg-lane-claim-token",
		File:  "schema/postgres_queries.sql",
		Old:   "CASE WHEN l.expires_at <= c.now_ms THEN l.fencing_token + 1",
		New:   "CASE WHEN l.expires_at <= l.renewed_at THEN l.fencing_token + 1",
		Stack: "postgres", Faults: []string{faultKill}, Seed: 36,
		Why: "PostgreSQL's lane claim gives a new token only to a released lane: a lane whose owner died passes on under the old token",
	},
	{
		Name:  "mysql-lane-claim-token",
		File:  "schema/mysql_queries.sql",
		Old:   "SET fencing_token = IF(expires_at <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, fencing_token + 1, fencing_token),",
		New:   "SET fencing_token = IF(expires_at <= renewed_at, fencing_token + 1, fencing_token),",
		Stack: "mysql", Faults: []string{faultKill}, Seed: 38,
		Why: "MySQL's lane claim, the same",
	},
	{
		Name:  "sqlite-lane-claim-token",
		File:  "schema/sqlite_queries.sql",
		Old:   "SET fencing_token = CASE WHEN expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) THEN fencing_token + 1",
		New:   "SET fencing_token = CASE WHEN expires_at <= renewed_at THEN fencing_token + 1",
		Stack: "sqlite", Faults: []string{faultKill}, Seed: 37,
		Why: "SQLite's lane claim, the same",
	},
	// Unreachable by the experiment: each is caught by a unit test.
	{
		Name:        "mysql-renew-revives",
		File:        "schema/mysql_queries.sql",
		Old:         "WHERE name = ? AND holder = ? AND instance = ? AND fencing_token = ?\n  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000\n  AND expires_at > renewed_at;",
		New:         "WHERE name = ? AND holder = ? AND instance = ? AND fencing_token = ?\n  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000\n  AND expires_at >= renewed_at;",
		Test:        "TestRenewDoesNotReviveAReleasedTerm",
		Why:         "MySQL's renew accepts a term whose expiry equals its renewal: a release (expires_at = renewed_at) that committed while the renew waited for the row is undone",
		Unreachable: "it needs a renew that started before a release to run after it, the row's lock held between: the nemesis cannot stop a statement there (Resign and Shutdown let a renew in flight finish before they release)",
		Needs:       "mysql",
	},
	{
		Name:        "mysql-lane-renew-revives",
		File:        "schema/mysql_queries.sql",
		Old:         "WHERE scope = ? AND instance = ?\n  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000\n  AND expires_at > renewed_at;",
		New:         "WHERE scope = ? AND instance = ?\n  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000\n  AND expires_at >= renewed_at;",
		Test:        "TestLaneRenewDoesNotReviveAReleasedLane",
		Why:         "MySQL's keeper renew, the same for lanes: a lane released while the keeper's renew waited stays held by its former owner",
		Unreachable: "the same interleaving, for the keeper's statement; and a revived lane stays with its owner, whose claims the row's lock still orders, so no write shows it",
		Needs:       "mysql",
	},
	{
		Name:        "pg-lane-claim-revives",
		File:        "schema/postgres_queries.sql",
		Old:         "  AND ((l.instance = $6 AND l.expires_at > c.now_ms AND l.expires_at > l.renewed_at) OR l.expires_at <= c.now_ms)",
		New:         "  AND ((l.instance = $6 AND l.expires_at > c.now_ms AND l.expires_at >= l.renewed_at) OR l.expires_at <= c.now_ms)",
		Test:        "TestLaneClaimDoesNotReviveAReleasedLane",
		Why:         "PostgreSQL's lane claim renews its own lane even when a release ended it while the claim waited: the claim keeps the old token where it needs a new one",
		Unreachable: "it needs the claim to wait for the row while a release of the same lane commits; and the revived claim writes under a token whose row it holds locked, so the database's order still shows no stale write",
		Needs:       "postgres",
	},
	{
		Name:        "pg-lease-guard-instance",
		File:        "schema/postgres.sql",
		Old:         "            IF (NEW.holder <> OLD.holder OR NEW.instance <> OLD.instance)\n               AND NOT (NEW.holder = ''",
		New:         "            IF (NEW.holder <> OLD.holder)\n               AND NOT (NEW.holder = ''",
		Test:        "TestTermCannotChangeHandsUnderOneToken",
		Why:         "PostgreSQL's lease guard lets a term pass to another instance of the same node under one token",
		Unreachable: "no statement of the library moves a term to another instance without a new token: the guard is the second line of defence, and only raw SQL reaches it",
		Needs:       "postgres",
	},
	// The witness.
	{
		Name:  "witness-equal",
		File:  "rollback.go",
		Old:   "		if have < seen {",
		New:   "		if have <= seen {",
		Stack: "sqlite", Faults: []string{faultKill}, Seed: 35,
		Why: "the boot check takes a database whose token equals the witness's for a rolled-back one: a node restarted before another term began refuses to start",
	},
}

// skipDirs are the directories of the repository that building this
// program does not need.
var skipDirs = map[string]bool{".git": true, ".ci": true, "bench": true, "examples": true, "cmd": true, "clusterprom": true, "docs": true, "testdata": true}

// plant copies the repository at root (without what the build does not
// need) to dst and plants m there. It fails when m's line is not in its
// file exactly once: the library moved on, and the mutant must follow.
func plant(root, dst string, m libMutant) error {
	withTests := m.Test != ""
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDirs[d.Name()] && rel != "." && !(withTests && d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() || strings.HasSuffix(path, "_test.go") && !withTests {
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
	if err := trimWorkspace(dst); err != nil {
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

// trimWorkspace drops from the copy's go.work the modules plant left out,
// which the go command would otherwise fail to load.
func trimWorkspace(dst string) error {
	path := filepath.Join(dst, "go.work")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var keep []string
	for _, line := range strings.Split(string(b), "\n") {
		dir, isUse := strings.CutPrefix(strings.TrimSpace(line), "./")
		if isUse && skipDirs[strings.Split(dir, "/")[0]] {
			continue
		}
		keep = append(keep, line)
	}
	return os.WriteFile(path, []byte(strings.Join(keep, "\n")), 0o644)
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

// testMutant plants m in a copy of the repository at root under dir and
// runs m.Test, the root package's unit test that must catch it; it returns
// whether that test failed (a test that fails to build is an error), and
// its output.
func testMutant(ctx context.Context, root, dir string, m libMutant) (bool, string, error) {
	src := filepath.Join(dir, "src")
	if err := plant(root, src, m); err != nil {
		return false, "", err
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", "^("+m.Test+")$", ".")
	cmd.Dir = src
	out, err := cmd.CombinedOutput()
	switch {
	case err == nil:
		return false, string(out), nil
	case bytes.Contains(out, []byte("--- FAIL")):
		return true, string(out), nil
	}
	return false, string(out), fmt.Errorf("mutant %s: go test %s: %v\n%s", m.Name, m.Test, err, out)
}
