package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// binary is the clusterctl the tests run, built once by TestMain.
var binary string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "clusterctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "clusterctl")
	if runtime.GOOS == "windows" {
		binary += ".exe"
	}
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build clusterctl: %v\n%s", err, out)
		return 1
	}
	code := m.Run()
	if code == 0 {
		// database/sql opens connections on a goroutine per pool; the pools
		// are closed by t.Cleanup but the opener may be mid-exit.
		if err := goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			return 1
		}
	}
	return code
}

// result is what a run of clusterctl did.
type result struct {
	code           int
	stdout, stderr string
}

// invocation is how clusterctl is run: its stdin, and its environment
// beyond the test's (without $CLUSTER_DSN unless env sets it).
type invocation struct {
	stdin string
	env   []string
}

// ctl runs clusterctl with args, nothing on stdin and $CLUSTER_DSN unset.
func ctl(t *testing.T, args ...string) result {
	t.Helper()
	return invocation{}.run(t, args...)
}

func (in invocation) run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvDSN+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, in.env...)
	cmd.Stdin = strings.NewReader(in.stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("clusterctl %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("clusterctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

// on returns the arguments of command cmd with flags, on target tg.
func on(tg testdb.Target, cmd string, flags ...string) []string {
	return append(append([]string{cmd}, flags...), "-dsn", tg.DSN, "-prefix", tg.Prefix)
}

// ok fails the test unless r succeeded, and returns its stdout.
func ok(t *testing.T, r result) string {
	t.Helper()
	if r.code != exitOK {
		t.Fatalf("exit status %d, want 0; stderr: %s", r.code, r.stderr)
	}
	return r.stdout
}

// failed fails the test unless r failed with status code and a one-line
// error on stderr that contains every one of want, and nothing on stdout.
func failed(t *testing.T, r result, code int, want ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status %d, want %d; stderr: %s", r.code, code, r.stderr)
	}
	if r.stdout != "" {
		t.Errorf("stdout is not empty: %q", r.stdout)
	}
	if code == exitFail && strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("stderr is not one line: %q", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr does not contain %q: %q", w, r.stderr)
		}
	}
}

// decode parses the JSON document a successful run printed.
func decode[T any](t *testing.T, r result) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(ok(t, r)), &v); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, r.stdout)
	}
	return v
}

// keys returns the sorted keys of a JSON object.
func keys(t *testing.T, raw json.RawMessage) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, raw)
	}
	return slices.Sorted(maps.Keys(m))
}

func TestUsage(t *testing.T) {
	sqliteDSN := "file:" + filepath.Join(t.TempDir(), "x.db")
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // contained in stdout
		stderr string // contained in stderr
	}{
		{"no command", nil, exitUsage, "", "Usage: clusterctl <command> [flags]"},
		{"help", []string{"help"}, exitOK, "Usage: clusterctl <command> [flags]", ""},
		{"-h", []string{"-h"}, exitOK, "Usage: clusterctl <command> [flags]", ""},
		{"--help", []string{"--help"}, exitOK, "Usage: clusterctl <command> [flags]", ""},
		{"help of a command", []string{"help", "release"}, exitOK, "Usage: clusterctl release [flags]", ""},
		{"command -h", []string{"status", "-h"}, exitOK, "-node-timeout", ""},
		{"unknown command", []string{"bogus"}, exitUsage, "", `unknown command "bogus"`},
		{"help of an unknown command", []string{"help", "bogus"}, exitUsage, "", `unknown command "bogus"`},
		{"flags before the command", []string{"-dsn", sqliteDSN, "status"}, exitUsage, "", "flags go after the command"},
		{"unknown flag", []string{"status", "-bogus"}, exitUsage, "", "flag provided but not defined: -bogus"},
		{"flag of another command", []string{"tips", "-lease", "x", "-dsn", sqliteDSN}, exitUsage, "", "flag provided but not defined: -lease"},
		{"argument", []string{"status", "-dsn", sqliteDSN, "now"}, exitUsage, "", `unexpected argument "now"`},
		{"no DSN", []string{"status"}, exitUsage, "", "set -dsn or $CLUSTER_DSN"},
		{"DSN of no known shape", []string{"status", "-dsn", "db.internal:5432"}, exitUsage, "", "set -dialect"},
		{"unknown dialect", []string{"status", "-dialect", "oracle", "-dsn", sqliteDSN}, exitUsage, "", `-dialect "oracle"`},
		{"bad prefix", []string{"status", "-prefix", "Cluster-", "-dsn", sqliteDSN}, exitUsage, "", `-prefix "Cluster-"`},
		{"bad timeout", []string{"members", "-node-timeout", "0s", "-dsn", sqliteDSN}, exitUsage, "", "-node-timeout"},
		{"schema without a dialect", []string{"schema"}, exitUsage, "", "set -dialect"},
		{"release without -force", []string{"release", "-dsn", sqliteDSN}, exitUsage, "", "without -force"},
		{"release of a lane without -force", []string{"release", "-lane", "k", "-dsn", sqliteDSN}, exitUsage, "", "without -force"},
		{"-lane of another command", []string{"lanes", "-lane", "k", "-dsn", sqliteDSN}, exitUsage, "", "flag provided but not defined: -lane"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ctl(t, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit status %d, want %d", r.code, tc.code)
			}
			if !strings.Contains(r.stdout, tc.stdout) {
				t.Errorf("stdout does not contain %q", tc.stdout)
			}
			if !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("stderr does not contain %q", tc.stderr)
			}
			if tc.code == exitOK && r.stderr != "" {
				t.Errorf("stderr is not empty")
			}
		})
	}
}

func TestSchema(t *testing.T) {
	for _, d := range testdb.Dialects {
		want, err := cluster.SchemaSQL(d, "ctl_")
		if err != nil {
			t.Fatal(err)
		}
		if got := ok(t, ctl(t, "schema", "-dialect", string(d), "-prefix", "ctl_")); got != want {
			t.Errorf("schema -dialect %s differs from cluster.SchemaSQL", d)
		}
		upper := strings.ToUpper(string(d)) // any case, as Config.Dialect
		if got := ok(t, ctl(t, "schema", "-dialect", upper, "-prefix", "ctl_")); got != want {
			t.Errorf("schema -dialect %s differs from cluster.SchemaSQL(%s)", upper, d)
		}
	}
	// The dialect comes from the DSN, here $CLUSTER_DSN.
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		want, err := cluster.SchemaSQL(tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		in := invocation{env: []string{EnvDSN + "=" + tg.DSN}}
		if got := ok(t, in.run(t, "schema", "-prefix", tg.Prefix)); got != want {
			t.Errorf("schema with $%s of %s differs from cluster.SchemaSQL", EnvDSN, tg.Dialect)
		}
	})
}

// Before migrate, every command says to run it; after, status reports a
// lease never acquired and no members.
func TestMigrate(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		in := invocation{env: []string{EnvDSN + "=" + tg.DSN}}
		for _, cmd := range []string{"status", "members", "tips", "fingerprint", "retire"} {
			failed(t, in.run(t, cmd, "-prefix", tg.Prefix), exitFail, "clusterctl migrate")
		}

		out := ok(t, in.run(t, "migrate", "-prefix", tg.Prefix))
		if want := fmt.Sprintf("created the cluster tables (prefix %q) at schema version %d", tg.Prefix, cluster.SchemaVersion); !strings.Contains(out, want) {
			t.Errorf("migrate printed %q, want %q", out, want)
		}
		m := decode[migrateJSON](t, in.run(t, "migrate", "-prefix", tg.Prefix, "-json"))
		if want := (migrateJSON{Dialect: tg.Dialect, Prefix: tg.Prefix, SchemaVersion: cluster.SchemaVersion, PreviousVersion: cluster.SchemaVersion}); m != want {
			t.Errorf("second migrate -json = %+v, want %+v", m, want)
		}
		if out := ok(t, in.run(t, "migrate", "-prefix", tg.Prefix)); !strings.Contains(out, "already") {
			t.Errorf("third migrate printed %q, want it to say the tables are current", out)
		}

		out = ok(t, in.run(t, "status", "-prefix", tg.Prefix))
		for _, want := range []string{"never acquired", `no members of lease "leader"`} {
			if !strings.Contains(out, want) {
				t.Errorf("status does not say %q:\n%s", want, out)
			}
		}
		s := decode[statusJSON](t, in.run(t, "status", "-prefix", tg.Prefix, "-json"))
		if s.Leader != nil || s.FencingToken != 0 || s.Members == nil || len(s.Members) != 0 || s.Lease != "leader" {
			t.Errorf("status -json on new tables = %+v, want no leader, token 0, members []", s)
		}
	})
}

// status -json against three running nodes names the leader they agree
// on; release -force ends its term and a node takes over with a higher
// token; retire is refused while the lease is held and works once the
// nodes stopped, keeping the token.
func TestStatusReleaseRetire(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		nodes := []*cluster.Cluster{startNode(t, tg, "node-a"), startNode(t, tg, "node-b"), startNode(t, tg, "node-c")}

		// The nodes' view before and after the call must agree, so that the
		// term did not change meanwhile; it does not on a quiet machine.
		var s statusJSON
		var leader *cluster.Cluster
		var token uint64
		for attempt := 0; ; attempt++ {
			leader = soleLeader(t, nodes...)
			token = leader.FencingToken()
			s = decode[statusJSON](t, ctl(t, on(tg, "status", "-json")...))
			if leader.IsLeader() && leader.FencingToken() == token || attempt == 3 {
				break
			}
		}
		if s.Leader == nil || s.Leader.NodeID != leader.NodeID() || s.Leader.FencingToken != token {
			t.Fatalf("status -json leader = %+v, want node %s with token %d", s.Leader, leader.NodeID(), token)
		}
		if s.Leader.Endpoint == nil || *s.Leader.Endpoint != leader.Endpoint() {
			t.Errorf("status -json endpoint = %v, want %s", s.Leader.Endpoint, leader.Endpoint())
		}
		if s.Leader.RemainingMs <= 0 || s.Leader.RemainingMs > 1000 {
			t.Errorf("status -json remainingMs = %d, want within the 1s lease", s.Leader.RemainingMs)
		}
		if s.FencingToken != token {
			t.Errorf("status -json fencingToken = %d, want %d", s.FencingToken, token)
		}
		leaders, live := 0, 0
		for _, m := range s.Members {
			if m.Leader {
				leaders++
				if m.NodeID != leader.NodeID() {
					t.Errorf("member %s is marked leader, not %s", m.NodeID, leader.NodeID())
				}
			}
			if m.Live && m.Status == "active" && m.PID == os.Getpid() && m.LastSeenAgoMs < 60_000 {
				live++
			}
		}
		if len(s.Members) != 3 || live != 3 || leaders != 1 {
			t.Errorf("status -json members = %+v, want three live members and one leader", s.Members)
		}

		// The JSON field names are part of the interface.
		raw := decode[map[string]json.RawMessage](t, ctl(t, on(tg, "status", "-json")...))
		if got, want := slices.Sorted(maps.Keys(raw)), []string{"fencingToken", "leader", "lease", "members", "nodeTimeoutMs"}; !slices.Equal(got, want) {
			t.Errorf("status -json keys = %v, want %v", got, want)
		}
		if got, want := keys(t, raw["leader"]), []string{"endpoint", "fencingToken", "leaseExpiresAt", "nodeId", "remainingMs"}; !slices.Equal(got, want) {
			t.Errorf("status -json leader keys = %v, want %v", got, want)
		}
		var members []json.RawMessage
		if err := json.Unmarshal(raw["members"], &members); err != nil || len(members) == 0 {
			t.Fatalf("status -json members: %v", err)
		}
		if got, want := keys(t, members[0]), []string{"endpoint", "host", "instance", "lastSeen", "lastSeenAgoMs", "leader", "live", "nodeId", "pid", "startedAt", "status", "timeoutMs"}; !slices.Equal(got, want) {
			t.Errorf("status -json member keys = %v, want %v", got, want)
		}

		// The tables.
		out := ok(t, ctl(t, on(tg, "status")...))
		for _, want := range []string{"leader    " + leader.NodeID(), "by the database clock", "NODE    INSTANCE", "node-a", "node-b", "node-c"} {
			if !strings.Contains(out, want) {
				t.Errorf("status does not contain %q:\n%s", want, out)
			}
		}
		out = ok(t, ctl(t, on(tg, "members")...))
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], "NODE") {
			t.Errorf("members printed %d lines, want a header and three members:\n%s", len(lines), out)
		}
		// Each member is judged by the node timeout it recorded, not by
		// -node-timeout, which judges only rows that recorded none.
		ms := decode[membersOutput](t, ctl(t, on(tg, "members", "-json", "-node-timeout", "1ms")...))
		for _, m := range ms.Members {
			if !m.Live || m.TimeoutMs != (testdb.LeaseTTL+3*testdb.Heartbeat).Milliseconds() {
				t.Errorf("member %s seen %dms ago: live %v by a timeout of %dms; want live by its own %v", m.NodeID, m.LastSeenAgoMs, m.Live, m.TimeoutMs, testdb.LeaseTTL+3*testdb.Heartbeat)
			}
		}

		// release needs -force, and asks.
		failed(t, ctl(t, on(tg, "release")...), exitUsage, "without -force")
		r := invocation{stdin: "n\n"}.run(t, on(tg, "release", "-force")...)
		failed(t, r, exitFail, fmt.Sprintf("Expire lease %q held by node %q (token %d)? [y/N]", "leader", leader.NodeID(), token), "not confirmed")
		if !leader.IsLeader() || leader.FencingToken() != token {
			t.Fatalf("the term ended though the release was not confirmed")
		}
		rel := decode[releaseJSON](t, ctl(t, on(tg, "release", "-force", "-yes", "-json")...))
		if want := (releaseJSON{Lease: "leader", Released: true, NodeID: leader.NodeID(), FencingToken: token}); rel != want {
			t.Errorf("release -force -yes -json = %+v, want %+v", rel, want)
		}
		leader = leaderAbove(t, token, nodes...)
		token = leader.FencingToken()
		r = invocation{stdin: "y\n"}.run(t, on(tg, "release", "-force")...)
		if out := ok(t, r); !strings.Contains(out, fmt.Sprintf("released lease %q: the term of node %q (token %d)", "leader", leader.NodeID(), token)) {
			t.Errorf("release -force answered y printed %q", out)
		}
		leader = leaderAbove(t, token, nodes...)
		token = leader.FencingToken()

		// retire is refused while the lease is held, before it asks.
		failed(t, ctl(t, on(tg, "retire", "-yes")...), exitFail, "is held by node")
		r = invocation{stdin: "y\n"}.run(t, on(tg, "retire")...)
		failed(t, r, exitFail, "is held by node")
		if strings.Contains(r.stderr, "[y/N]") {
			t.Errorf("retire asked though the lease is held")
		}

		// Stopped nodes release the lease; retire then works and keeps
		// the token.
		for _, n := range nodes {
			if err := n.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		s = decode[statusJSON](t, ctl(t, on(tg, "status", "-json")...))
		if s.Leader != nil || s.FencingToken < token {
			t.Fatalf("status -json after shutdown = %+v, want no leader and token %d or more", s, token)
		}
		last := s.FencingToken
		out = ok(t, invocation{stdin: "yes\n"}.run(t, on(tg, "retire")...))
		if want := fmt.Sprintf("retired lease %q: no holder, its members marked left; fencing token %d kept, so its next term gets %d", "leader", last, last+1); !strings.Contains(out, want) {
			t.Errorf("retire printed %q, want %q", out, want)
		}
		ret := decode[retireJSON](t, ctl(t, on(tg, "retire", "-yes", "-json")...))
		if want := (retireJSON{Lease: "leader", Retired: true, FencingToken: last}); ret != want {
			t.Errorf("retire -yes -json = %+v, want %+v", ret, want)
		}
		s = decode[statusJSON](t, ctl(t, on(tg, "status", "-json")...))
		if s.Leader != nil || s.FencingToken != last || len(s.Members) != 3 {
			t.Fatalf("status -json after retire = %+v, want no leader, token %d, three members", s, last)
		}
		for _, m := range s.Members {
			if m.Status != "left" || m.Live || m.Leader {
				t.Errorf("member after retire = %+v, want left, not live, not leader", m.Member)
			}
		}
		out = ok(t, ctl(t, on(tg, "status")...))
		if want := "none: the lease is free"; !strings.Contains(out, want) {
			t.Errorf("status after retire does not say %q:\n%s", want, out)
		}
		if out := ok(t, ctl(t, on(tg, "release", "-force", "-yes")...)); !strings.Contains(out, "not held") {
			t.Errorf("release of a free lease printed %q", out)
		}

		// The token history is kept: the next term continues from it.
		d := startNode(t, tg, "node-d")
		waitFor(t, "node-d to lead", d.IsLeader)
		if got := d.FencingToken(); got != last+1 {
			t.Errorf("a new node's token after retire = %d, want %d", got, last+1)
		}
		s = decode[statusJSON](t, ctl(t, on(tg, "status", "-json")...))
		if s.Leader == nil || s.Leader.NodeID != "node-d" || s.Leader.FencingToken != last+1 || len(s.Members) != 4 {
			t.Errorf("status -json with node-d = %+v, want node-d leading with token %d among four members", s, last+1)
		}
	})
}

func TestFingerprint(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ok(t, ctl(t, on(tg, "migrate")...))
		if out := ok(t, ctl(t, on(tg, "fingerprint")...)); !strings.Contains(out, "none recorded") {
			t.Errorf("fingerprint with none recorded printed %q", out)
		}
		if f := decode[fingerprintOutput](t, ctl(t, on(tg, "fingerprint", "-json")...)); f.Fingerprint != nil || f.Lease != "leader" {
			t.Errorf("fingerprint -json with none recorded = %+v", f)
		}

		fp := strings.Repeat("0123456789abcdef", 8)
		startNode(t, tg, "node-a", func(c *cluster.Config) { c.VaultKeyFingerprint = fp })
		out := ok(t, ctl(t, on(tg, "fingerprint")...))
		for _, want := range []string{"fingerprint     0123456789abcdef…\n", "rotation epoch  0\n", "recorded by     node-a\n", "recorded at     "} {
			if !strings.Contains(out, want) {
				t.Errorf("fingerprint does not contain %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, fp[:17]) {
			t.Errorf("fingerprint printed more than 16 hex characters:\n%s", out)
		}
		f := decode[fingerprintOutput](t, ctl(t, on(tg, "fingerprint", "-json")...))
		if f.Fingerprint == nil || f.Fingerprint.Prefix != fp[:16] || f.Fingerprint.RotationEpoch != 0 ||
			f.Fingerprint.RecordedBy != "node-a" || f.Fingerprint.RecordedAt.IsZero() {
			t.Errorf("fingerprint -json = %+v, want prefix %s, epoch 0, recorded by node-a", f.Fingerprint, fp[:16])
		}
		// Another lease name has none.
		if f := decode[fingerprintOutput](t, ctl(t, on(tg, "fingerprint", "-json", "-lease", "other")...)); f.Fingerprint != nil {
			t.Errorf("fingerprint -json -lease other = %+v, want none", f.Fingerprint)
		}
	})
}

func TestTips(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		db := tg.Open(t)
		table := createAuditTable(t, tg, db)
		a := startNode(t, tg, "node-a", func(c *cluster.Config) {
			c.Chains = []cluster.Chain{{Name: "audit", Table: table}}
		})
		if out := ok(t, ctl(t, on(tg, "tips")...)); out != "no chain tips recorded\n" {
			t.Errorf("tips before any tip printed %q", out)
		}
		waitFor(t, "node-a to lead", a.IsLeader)
		appendAudit(t, tg, a, db, table, 1, 3)
		token := a.FencingToken()

		out := ok(t, ctl(t, on(tg, "tips")...))
		want := fmt.Sprintf("CHAIN  LEASE   COUNTER  TOKEN  HASH\naudit  leader  3        %-5d  %s\n", token, hex.EncodeToString(rowHash(3))[:16])
		if out != want {
			t.Errorf("tips printed\n%s\nwant\n%s", out, want)
		}
		got := decode[tipsOutput](t, ctl(t, on(tg, "tips", "-json")...))
		if want := []tipJSON{{Chain: "audit", Lease: "leader", Counter: 3, FencingToken: token, Hash: hex.EncodeToString(rowHash(3))}}; !slices.Equal(got.Tips, want) {
			t.Errorf("tips -json = %+v, want %+v", got.Tips, want)
		}
	})
}

// A DSN that cannot connect fails with status 1 and one line that names
// what failed and never the password.
func TestWrongDSN(t *testing.T) {
	const password = "pw-Sec4et-9f2"
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		var cases []struct{ name, dsn, dialect, want string }
		add := func(name, dsn, dialect, want string) {
			cases = append(cases, struct{ name, dsn, dialect, want string }{name, dsn, dialect, want})
		}
		switch tg.Dialect {
		case cluster.Postgres:
			add("unreachable", "postgres://nobody:"+password+"@"+testdb.FreeAddr(t)+"/test?sslmode=disable", "", "connect to the postgres database")
			add("bad credentials", testdb.WithUser(t, tg, "clusterctl_nobody", password), "", "connect to the postgres database")
			add("bad syntax", "postgres://nobody:"+password+"@127.0.0.1:port/test", "", "postgres database")
			add("bad syntax, key=value", "host=127.0.0.1 port=x user=nobody password="+password, "postgres", "postgres database")
		case cluster.MySQL:
			add("unreachable", "nobody:"+password+"@tcp("+testdb.FreeAddr(t)+")/test", "", "connect to the mysql database")
			add("bad credentials", testdb.WithUser(t, tg, "clusterctl_nobody", password), "", "connect to the mysql database")
			add("bad syntax", "nobody:"+password+"@tcp(127.0.0.1:3306", "mysql", "open the mysql database")
		case cluster.SQLite:
			dir := filepath.Join(t.TempDir(), "no", "such", "dir")
			add("missing file", "file:"+filepath.Join(dir, "cluster.db")+"?_pragma=busy_timeout(1000)", "", "does not exist")
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				args := []string{"status"}
				if c.dialect != "" {
					args = append(args, "-dialect", c.dialect)
				}
				// The DSN as a flag, then in $CLUSTER_DSN.
				for _, r := range []result{ctl(t, append(args, "-dsn", c.dsn)...), invocation{env: []string{EnvDSN + "=" + c.dsn}}.run(t, args...)} {
					failed(t, r, exitFail, c.want)
					if !strings.HasPrefix(r.stderr, "clusterctl: ") {
						t.Errorf("stderr does not start with %q: %q", "clusterctl: ", r.stderr)
					}
					if strings.Contains(r.stderr, password) {
						t.Errorf("stderr shows the password: %q", r.stderr)
					}
				}
			})
		}
		if tg.Dialect == cluster.SQLite {
			// migrate creates a missing file, but not a missing directory.
			dsn := "file:" + filepath.Join(t.TempDir(), "no", "dir", "cluster.db")
			failed(t, ctl(t, "migrate", "-dsn", dsn), exitFail, "connect to the sqlite database")
		}
	})
}

// claimLane claims lane key for c in a transaction of db, and commits.
func claimLane(t *testing.T, c *cluster.Cluster, db *sql.DB, key string) uint64 {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	token, err := c.ClaimLane(ctx, tx, key)
	if err != nil {
		t.Fatalf("%s's claim of lane %s: %v", c.NodeID(), key, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return token
}

// lanes lists who holds what; release -lane ends one claim, whoever holds
// it, keeping its token, after -force and a confirmation.
func TestLanes(t *testing.T) {
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		a, b := startNode(t, tg, "node-a"), startNode(t, tg, "node-b")
		db := tg.Open(t)
		if out := ok(t, ctl(t, on(tg, "lanes")...)); !strings.Contains(out, `no lanes of lease "leader" recorded`) {
			t.Errorf("lanes before any claim printed %q", out)
		}
		// b claims first: were a to hold two lanes of two when b starts
		// taking lanes, a's next heartbeat would hand one over as above
		// its share. In this order neither is ever above ⌈lanes/2⌉.
		claimLane(t, b, db, "k3")
		claimLane(t, a, db, "k1")
		claimLane(t, a, db, "k2")

		ls := decode[lanesOutput](t, ctl(t, on(tg, "lanes", "-json")...))
		if ls.Lease != "leader" || len(ls.Lanes) != 3 {
			t.Fatalf("lanes -json = %+v, want three lanes of lease leader", ls)
		}
		for i, want := range []struct{ lane, holder string }{{"k1", "node-a"}, {"k2", "node-a"}, {"k3", "node-b"}} {
			l := ls.Lanes[i]
			if l.Lane != want.lane || l.Holder != want.holder || !l.Held || l.FencingToken != 1 || l.Instance == "" ||
				l.RemainingMs <= 0 || l.RemainingMs > 1000 || l.ExpiresAt <= l.AcquiredAt {
				t.Errorf("lanes -json lane %d = %+v, want %s held by %s with token 1 and at most 1s left", i, l, want.lane, want.holder)
			}
		}
		raw := decode[map[string]json.RawMessage](t, ctl(t, on(tg, "lanes", "-json")...))
		var rawLanes []json.RawMessage
		if err := json.Unmarshal(raw["lanes"], &rawLanes); err != nil || len(rawLanes) == 0 {
			t.Fatalf("lanes -json lanes: %v", err)
		}
		if got, want := keys(t, rawLanes[0]), []string{"acquiredAt", "expiresAt", "fencingToken", "held", "holder", "instance", "lane", "remainingMs"}; !slices.Equal(got, want) {
			t.Errorf("lanes -json lane keys = %v, want %v", got, want)
		}
		out := ok(t, ctl(t, on(tg, "lanes")...))
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 5 || !strings.HasPrefix(lines[0], "LANE") ||
			!strings.HasPrefix(lines[3], "k3") || !strings.Contains(lines[3], "node-b") {
			t.Errorf("lanes printed:\n%s\nwant a header, three lanes and a note", out)
		}

		// release -lane needs -force, and asks.
		failed(t, ctl(t, on(tg, "release", "-lane", "k1")...), exitUsage, "without -force")
		r := invocation{stdin: "n\n"}.run(t, on(tg, "release", "-lane", "k1", "-force")...)
		failed(t, r, exitFail, fmt.Sprintf("End the claim on lane %q of lease %q held by node %q (token 1)? [y/N]", "k1", "leader", "node-a"), "not confirmed")
		if !a.OwnsLane("k1") {
			t.Fatal("a lost k1 though the release was not confirmed")
		}
		rel := decode[releaseLaneJSON](t, ctl(t, on(tg, "release", "-lane", "k1", "-force", "-yes", "-json")...))
		if want := (releaseLaneJSON{Lease: "leader", Lane: "k1", Released: true, NodeID: "node-a", FencingToken: 1}); rel != want {
			t.Errorf("release -lane -force -yes -json = %+v, want %+v", rel, want)
		}
		waitFor(t, "node-a to learn it lost k1", func() bool { return !a.OwnsLane("k1") })
		if out := ok(t, ctl(t, on(tg, "release", "-lane", "k1", "-force", "-yes")...)); !strings.Contains(out, `lane "k1" of lease "leader" is not held`) {
			t.Errorf("release of a free lane printed %q", out)
		}
		if out := ok(t, ctl(t, on(tg, "release", "-lane", "never", "-force", "-yes")...)); !strings.Contains(out, "is not held") {
			t.Errorf("release of a lane never claimed printed %q", out)
		}
		// b takes it, under the next token; answered y, release ends that.
		if token := claimLane(t, b, db, "k1"); token != 2 {
			t.Fatalf("claim after the forced release got token %d, want 2", token)
		}
		out = ok(t, invocation{stdin: "y\n"}.run(t, on(tg, "release", "-lane", "k1", "-force")...))
		if want := fmt.Sprintf("released lane %q of lease %q: the claim of node %q (token 2)", "k1", "leader", "node-b"); !strings.Contains(out, want) {
			t.Errorf("release -lane answered y printed %q, want %q", out, want)
		}

		// Stopped nodes release their lanes: every lane is free, its
		// token kept.
		for _, n := range []*cluster.Cluster{a, b} {
			if err := n.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		ls = decode[lanesOutput](t, ctl(t, on(tg, "lanes", "-json")...))
		tokens := map[string]uint64{"k1": 2, "k2": 1, "k3": 1}
		for _, l := range ls.Lanes {
			if l.Held || l.RemainingMs != 0 || l.FencingToken != tokens[l.Lane] {
				t.Errorf("lane after shutdown = %+v, want free with token %d", l, tokens[l.Lane])
			}
		}
		if out := ok(t, ctl(t, on(tg, "lanes")...)); strings.Count(out, "  free\n") != 3 {
			t.Errorf("lanes after shutdown printed:\n%s\nwant three free lanes", out)
		}
	})
}

// forget removes a dead node's membership rows, as a built binary run by
// an operator: it refuses a live node (nothing removed), asks for
// confirmation, takes flags before or after the node, and the library's
// own Members agrees with what it left. DBProvider.Forget never removes a
// live row.
func TestForget(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := startNode(t, tg, "a")
		b := startNode(t, tg, "b")
		soleLeader(t, a, b)

		failed(t, ctl(t, on(tg, "forget", "-yes", "b")...), exitFail, `node "b" is live`)
		failed(t, ctl(t, on(tg, "forget")...), exitUsage, "which node")
		failed(t, ctl(t, on(tg, "forget", "-yes", "nobody")...), exitFail, `node "nobody" has no membership row`)

		if err := b.Shutdown(ctx); err != nil { // its row is marked left
			t.Fatal(err)
		}
		r := invocation{stdin: "n\n"}.run(t, on(tg, "forget", "b")...)
		if r.code != exitFail || !strings.Contains(r.stderr, "not confirmed") {
			t.Fatalf("forget answered no: exit %d, %q", r.code, r.stderr)
		}
		args := append([]string{"forget", "b", "-yes"}, "-dsn", tg.DSN, "-prefix", tg.Prefix, "-json")
		var got struct {
			NodeID    string `json:"nodeId"`
			Forgotten int    `json:"forgotten"`
		}
		if err := json.Unmarshal([]byte(ok(t, ctl(t, args...))), &got); err != nil || got.NodeID != "b" || got.Forgotten != 1 {
			t.Fatalf("forget -json = %+v (%v), want b and one row forgotten", got, err)
		}
		ms, err := a.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.NodeID == "b" {
				t.Fatalf("b is still a member after forget: %+v", m)
			}
		}

		// A crashed process: its row still active, last seen long ago.
		db := tg.Open(t)
		q := "INSERT INTO " + tg.Prefix + "nodes (scope, instance, node_id, host, pid, endpoint, started_at, last_seen, status) VALUES ('leader', 'ghost-1', 'ghost', 'h', 1, '', 1, 1, 'active')"
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
		out := ok(t, ctl(t, on(tg, "forget", "-yes", "ghost")...))
		if !strings.Contains(out, `forgot node "ghost"`) {
			t.Fatalf("forget of a crashed node = %q", out)
		}

		p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := p.Forget(ctx, cluster.DefaultLeaseName, "a", time.Minute); !errors.Is(err, cluster.ErrMemberLive) || n != 0 {
			t.Fatalf("Forget of the live leader = %d, %v; want 0 and ErrMemberLive", n, err)
		}
		if !a.IsLeader() {
			t.Fatal("a stopped leading after an attempt to forget it")
		}
	})
}

// Every member records its node timeout, and clusterctl judges liveness
// by it, as Members and MembersHandler do: a node that crashes (its pool
// closed under it; it never leaves) shows not live to both within seconds
// of its 1.3s timeout (LeaseTTL 1s and three heartbeats of 100ms), though
// clusterctl's -node-timeout is 60s.
func TestMembersJudgedByOwnTimeout(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		a := startNode(t, tg, "a")
		bdb := tg.Open(t)
		cfg := tg.Config(t, bdb, "b")
		b, err := cluster.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Shutdown(context.Background()) })
		soleLeader(t, a, b)
		want := cfg.LeaseTTL + 3*cfg.HeartbeatInterval

		type member struct {
			NodeID    string `json:"nodeId"`
			Live      bool   `json:"live"`
			TimeoutMs int64  `json:"timeoutMs"`
		}
		members := func() map[string]member {
			var got struct {
				NodeTimeoutMs int64    `json:"nodeTimeoutMs"`
				Members       []member `json:"members"`
			}
			if err := json.Unmarshal([]byte(ok(t, ctl(t, on(tg, "members", "-json")...))), &got); err != nil {
				t.Fatal(err)
			}
			if got.NodeTimeoutMs != 60000 {
				t.Fatalf("-node-timeout = %dms, want the default 60s", got.NodeTimeoutMs)
			}
			out := map[string]member{}
			for _, m := range got.Members {
				out[m.NodeID] = m
			}
			return out
		}
		if m := members(); !m["b"].Live || m["b"].TimeoutMs != want.Milliseconds() || m["a"].TimeoutMs != want.Milliseconds() {
			t.Fatalf("before the crash: %+v, want a and b live with timeout %v", m, want)
		}
		if table := ok(t, ctl(t, on(tg, "members")...)); !strings.Contains(table, "TIMEOUT") || !strings.Contains(table, want.String()) {
			t.Fatalf("members table without the node timeout:\n%s", table)
		}

		bdb.Close() // b crashes: never seen again, never leaves
		crashed := time.Now()
		waitFor(t, "Members to show b not live", func() bool {
			ms, err := a.Members(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				if m.NodeID == "b" {
					return !m.Live
				}
			}
			return false
		})
		byLibrary := time.Since(crashed)
		if m := members(); m["b"].Live {
			t.Fatalf("%v after b crashed, Members says not live, clusterctl members says live: %+v", byLibrary, m["b"])
		}
		if m := members(); !m["a"].Live {
			t.Fatalf("clusterctl members shows the live node a not live: %+v", m["a"])
		}
		t.Logf("b not live %v after its crash, to Members and to clusterctl", byLibrary.Round(time.Millisecond))
		// forget takes it at once, by the same rule.
		if out := ok(t, ctl(t, on(tg, "forget", "-yes", "b")...)); !strings.Contains(out, `forgot node "b"`) {
			t.Fatalf("forget of the crashed b = %q", out)
		}
	})
}
