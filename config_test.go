package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.SQLite)
	db := tg.Open(t)
	valid := func() cluster.Config { return cluster.Config{NodeID: "n1", DB: db} }
	tests := []struct {
		name string
		edit func(*cluster.Config)
		want []string // substrings of the message: field, value, limit
	}{
		{"no node id", func(c *cluster.Config) { c.NodeID = "" }, []string{"NodeID is required"}},
		{"node id too long", func(c *cluster.Config) { c.NodeID = strings.Repeat("x", 256) }, []string{"NodeID", "256 bytes", "255"}},
		{"node id control char", func(c *cluster.Config) { c.NodeID = "a\nb" }, []string{"NodeID", `"a\nb"`, "control"}},
		{"node id invalid utf8", func(c *cluster.Config) { c.NodeID = "a\xffb" }, []string{"NodeID", "UTF-8"}},
		{"node id trailing space", func(c *cluster.Config) { c.NodeID = "n1 " }, []string{"NodeID", `"n1 "`, "begin or end with a space"}},
		{"node id leading space", func(c *cluster.Config) { c.NodeID = " n1" }, []string{"NodeID", `" n1"`, "begin or end with a space"}},
		{"node id no-break space", func(c *cluster.Config) { c.NodeID = "n1\u00a0" }, []string{"NodeID", "non-printing"}},
		{"bad role", func(c *cluster.Config) { c.Role = "boss" }, []string{"Role", `"boss"`, `"leader"`, `"follower"`}},
		{"lease name control char", func(c *cluster.Config) { c.LeaseName = "x\x00" }, []string{"LeaseName", "control"}},
		{"lease name trailing space", func(c *cluster.Config) { c.LeaseName = "jobs " }, []string{"LeaseName", `"jobs "`, "begin or end with a space", "trailing spaces"}},
		{"lease name leading space", func(c *cluster.Config) { c.LeaseName = " jobs" }, []string{"LeaseName", `" jobs"`, "begin or end with a space"}},
		{"lease name only a space", func(c *cluster.Config) { c.LeaseName = " " }, []string{"LeaseName", `" "`, "begin or end with a space"}},
		{"lease name ideographic space", func(c *cluster.Config) { c.LeaseName = "jobs\u3000" }, []string{"LeaseName", "non-printing"}},
		{"chain name trailing space", func(c *cluster.Config) { c.Chains = []cluster.Chain{{Name: "audit ", Table: "audit"}} },
			[]string{"Chains[0].Name", `"audit "`, "begin or end with a space"}},
		{"chain name leading space", func(c *cluster.Config) {
			c.Chains = []cluster.Chain{{Name: "audit", Table: "a"}, {Name: " audit", Table: "b"}}
		},
			[]string{"Chains[1].Name", `" audit"`, "begin or end with a space"}},
		{"lease name too long", func(c *cluster.Config) { c.LeaseName = strings.Repeat("x", 129) }, []string{"LeaseName", "129 bytes", "128"}},
		{"ttl too short", func(c *cluster.Config) { c.LeaseTTL = 500 * time.Millisecond }, []string{"LeaseTTL", "500ms", "1s"}},
		{"ttl negative", func(c *cluster.Config) { c.LeaseTTL = -time.Second }, []string{"LeaseTTL", "-1s", "at least 1s"}},
		{"ttl above max", func(c *cluster.Config) { c.LeaseTTL = 24*time.Hour + time.Millisecond }, []string{"LeaseTTL (24h0m0.001s) must be at most 24h0m0s"}},
		{"ttl centuries", func(c *cluster.Config) { c.LeaseTTL = 290 * 365 * 24 * time.Hour }, []string{"LeaseTTL (2540400h0m0s)", "at most 24h0m0s"}},
		{"ttl sub-millisecond", func(c *cluster.Config) { c.LeaseTTL = time.Second + time.Microsecond }, []string{"LeaseTTL", "1.000001s", "milliseconds"}},
		{"heartbeat too short", func(c *cluster.Config) { c.HeartbeatInterval = 50 * time.Millisecond }, []string{"HeartbeatInterval", "50ms", "100ms"}},
		{"heartbeat not below ttl", func(c *cluster.Config) { c.LeaseTTL = 30 * time.Second; c.HeartbeatInterval = 30 * time.Second },
			[]string{"HeartbeatInterval (30s) must be less than LeaseTTL (30s)"}},
		{"fence not above heartbeat", func(c *cluster.Config) { c.HeartbeatInterval = time.Second; c.FenceTimeout = time.Second },
			[]string{"FenceTimeout (1s) must be greater than HeartbeatInterval (1s)"}},
		{"default fence not above heartbeat", func(c *cluster.Config) { c.LeaseTTL = 2 * time.Second; c.HeartbeatInterval = 1500 * time.Millisecond },
			[]string{"FenceTimeout (500ms", "default", "HeartbeatInterval (1.5s)"}},
		{"fence not below ttl", func(c *cluster.Config) { c.FenceTimeout = 30 * time.Second }, []string{"FenceTimeout (30s) must be less than LeaseTTL (30s)"}},
		{"endpoint relative", func(c *cluster.Config) { c.Endpoint = "/leader" }, []string{"Endpoint", `"/leader"`, "absolute"}},
		{"endpoint http", func(c *cluster.Config) { c.Endpoint = "http://a.internal" }, []string{"Endpoint", "http", "AllowInsecureEndpoint"}},
		{"endpoint scheme", func(c *cluster.Config) { c.Endpoint = "ftp://a.internal" }, []string{"Endpoint", `"ftp"`, "https"}},
		{"endpoint no host", func(c *cluster.Config) { c.Endpoint = "https:///path" }, []string{"Endpoint", "host"}},
		{"endpoint opaque", func(c *cluster.Config) { c.Endpoint = "https:a.internal" }, []string{"Endpoint", "host"}},
		{"endpoint user info", func(c *cluster.Config) { c.Endpoint = "https://u:p@a.internal" }, []string{"Endpoint", "user info"}},
		{"endpoint fragment", func(c *cluster.Config) { c.Endpoint = "https://a.internal/#x" }, []string{"Endpoint", "fragment"}},
		{"endpoint empty fragment", func(c *cluster.Config) { c.Endpoint = "https://a.internal/#" }, []string{"Endpoint", "fragment"}},
		{"endpoint control", func(c *cluster.Config) { c.Endpoint = "https://a.internal/\r\nX-Evil: 1" }, []string{"Endpoint", "control"}},
		{"endpoint space", func(c *cluster.Config) { c.Endpoint = "https://a internal" }, []string{"Endpoint", "control characters or spaces"}},
		{"endpoint too long", func(c *cluster.Config) { c.Endpoint = "https://a.internal/" + strings.Repeat("x", 2048) }, []string{"Endpoint", "2048"}},
		{"prefix uppercase", func(c *cluster.Config) { c.TablePrefix = "Cluster_" }, []string{"TablePrefix", `"Cluster_"`, "^[a-z_][a-z0-9_]*$"}},
		{"prefix injection", func(c *cluster.Config) { c.TablePrefix = "x; DROP TABLE y; --" }, []string{"TablePrefix"}},
		{"prefix too long", func(c *cluster.Config) { c.TablePrefix = strings.Repeat("a", 41) },
			[]string{"TablePrefix (\"" + strings.Repeat("a", 41) + "\", 41 bytes)", "at most", "PostgreSQL's 63-byte identifiers", strings.Repeat("a", 41) + "chain_tips"}},
		{"no db", func(c *cluster.Config) { c.DB = nil }, []string{"DB is required"}},
		{"bad dialect", func(c *cluster.Config) { c.Dialect = "oracle" }, []string{"Dialect", `"oracle"`}},
		{"wrong dialect", func(c *cluster.Config) { c.Dialect = cluster.Postgres }, []string{"Dialect", `"postgres"`, "modernc.org/sqlite", `"sqlite"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.edit(&cfg)
			err := cfg.Validate()
			if !errors.Is(err, cluster.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q does not contain %q", err, w)
				}
			}
			// New refuses it the same way, before touching anything.
			if c, err := cluster.New(context.Background(), cfg); !errors.Is(err, cluster.ErrInvalidConfig) || c != nil {
				t.Fatalf("New() = %v, %v; want nil, ErrInvalidConfig", c, err)
			}
		})
	}
}

func TestConfigValid(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, cluster.SQLite).Open(t)
	for name, cfg := range map[string]cluster.Config{
		"defaults":         {NodeID: "n1", DB: db},
		"https endpoint":   {NodeID: "n1", DB: db, Endpoint: "https://n1.internal:8443/base?x=1"},
		"http allowed":     {NodeID: "n1", DB: db, Endpoint: "http://127.0.0.1:8080", AllowInsecureEndpoint: true},
		"ipv6 endpoint":    {NodeID: "n1", DB: db, Endpoint: "https://[::1]:8443"},
		"short lease":      {NodeID: "n1", DB: db, LeaseTTL: time.Second},
		"longest lease":    {NodeID: "n1", DB: db, LeaseTTL: 24 * time.Hour},
		"explicit dialect": {NodeID: "n1", DB: db, Dialect: cluster.SQLite},
		"unicode node id":  {NodeID: "nœud-1", DB: db},
		"inner spaces":     {NodeID: "node 1", DB: db, LeaseName: "nightly jobs", Chains: []cluster.Chain{{Name: "audit log", Table: "audit"}}},
		"custom provider":  {NodeID: "n1", Provider: &fakeProvider{}},
		"follower":         {NodeID: "n1", DB: db, Role: cluster.RoleFollower},
	} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// An unknown driver with no Dialect set is refused with advice.
func TestConfigUnknownDriver(t *testing.T) {
	t.Parallel()
	sql.Register("cluster-test-unknown", unknownDriver{})
	db, _ := sql.Open("cluster-test-unknown", "")
	defer db.Close()
	err := cluster.Config{NodeID: "n1", DB: db}.Validate()
	if !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), "set Dialect") {
		t.Fatalf("Validate() = %v, want advice to set Dialect", err)
	}
}

// Whatever the input, Validate never panics, and what it accepts is safe
// to store in the lease row, to use in SQL, and to add to a reading of the
// monotonic clock.
func FuzzConfigValidate(f *testing.F) {
	f.Add("node-1", "https://node-1.internal:8443", "cluster_", "leader", int64(0), int64(0), int64(0))
	f.Add("", "http://x", "Cluster", "", int64(time.Second), int64(-1), int64(0))
	f.Add("n\x00", "https://u@h/#f", "a;drop", "l\n", int64(-time.Hour), int64(time.Hour), int64(time.Hour))
	f.Add("nœud", "https://[::1]:8443/p?q=1", "_x9", "élection", int64(24*time.Hour), int64(0), int64(0))
	// Durations a process's monotonic clock cannot add to without wrapping.
	f.Add("n", "", "", "", int64(math.MaxInt64/int64(time.Millisecond)*int64(time.Millisecond)), int64(100*time.Millisecond), int64(0))
	f.Add("n", "", "", "", int64(290*365*24*time.Hour), int64(time.Second), int64(289*365*24*time.Hour))
	f.Fuzz(func(t *testing.T, nodeID, endpoint, prefix, lease string, ttl, heartbeat, fence int64) {
		cfg := cluster.Config{NodeID: nodeID, Endpoint: endpoint, TablePrefix: prefix, LeaseName: lease, Provider: &fakeProvider{},
			LeaseTTL: time.Duration(ttl), HeartbeatInterval: time.Duration(heartbeat), FenceTimeout: time.Duration(fence)}
		err := cfg.Validate()
		if err != nil {
			if !errors.Is(err, cluster.ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		if !utf8.ValidString(nodeID) || strings.ContainsAny(nodeID, "\x00\n\r\t") || len(nodeID) > 255 {
			t.Fatalf("accepted NodeID %q", nodeID)
		}
		if prefix != "" && (!regexp.MustCompile(`^[a-z_][a-z0-9_]*$`).MatchString(prefix) || len(prefix)+len(longestSchemaSuffix(t)) > 63) {
			t.Fatalf("accepted TablePrefix %q", prefix)
		}
		if endpoint != "" {
			u, err := url.Parse(endpoint)
			if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.User != nil || strings.ContainsAny(endpoint, "#\r\n ") {
				t.Fatalf("accepted Endpoint %q", endpoint)
			}
		}
		r, err := cluster.ResolveConfig(cfg)
		if err != nil {
			t.Fatalf("Validate accepted what resolve refuses: %v", err)
		}
		checkDeadlines(t, r)
	})
}

// checkDeadlines fails the test unless every timing of r, added to any
// reading the monotonic clock of a process can take (it starts near 0 and
// would need centuries to near the int64 limit), gives a later reading
// without saturating.
func checkDeadlines(t *testing.T, r cluster.Config) {
	t.Helper()
	const uptime = 200 * 365 * 24 * time.Hour
	for name, d := range map[string]time.Duration{"LeaseTTL": r.LeaseTTL, "HeartbeatInterval": r.HeartbeatInterval, "FenceTimeout": r.FenceTimeout} {
		if d <= 0 || d > cluster.MaxLeaseTTL {
			t.Fatalf("accepted %s %v, outside (0, MaxLeaseTTL]", name, d)
		}
		for _, start := range []int64{1, int64(uptime)} {
			if end := cluster.MonoAfter(start, d); end <= start || end-start != int64(d) || end == math.MaxInt64 {
				t.Fatalf("%s %v after monotonic reading %d gives %d: the deadline arithmetic overflows", name, d, start, end)
			}
		}
	}
}

// Deadlines saturate rather than wrap, whatever is added.
func TestMonoAfterSaturates(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		start int64
		d     time.Duration
		want  int64
	}{
		{1, time.Second, 1 + int64(time.Second)},
		{math.MaxInt64 - 10, 10, math.MaxInt64},
		{math.MaxInt64 - 10, 11, math.MaxInt64},
		{1, math.MaxInt64, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{int64(time.Hour), -time.Minute, int64(time.Hour - time.Minute)},
		{math.MinInt64 + 1, -2, math.MinInt64},
	} {
		if got := cluster.MonoAfter(tt.start, tt.d); got != tt.want {
			t.Errorf("MonoAfter(%d, %d) = %d, want %d", tt.start, tt.d, got, tt.want)
		}
	}
}

// Role and Dialect are matched in any case, as the reference system does:
// "LEADER" is RoleLeader and "SQLite" is SQLite, in Config, in SchemaSQL
// and in NewSQLProvider; anything else is still refused.
func TestRoleAndDialectAnyCase(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, cluster.SQLite).Open(t)
	for _, tc := range []struct {
		role    cluster.Role
		dialect cluster.Dialect
		want    cluster.Role
	}{
		{"LEADER", "SQLITE", cluster.RoleLeader},
		{"Follower", "SQLite", cluster.RoleFollower},
	} {
		cfg, err := cluster.ResolveConfig(cluster.Config{NodeID: "n1", DB: db, Role: tc.role, Dialect: tc.dialect})
		if err != nil || cfg.Role != tc.want || cfg.Dialect != cluster.SQLite {
			t.Errorf("Role %q, Dialect %q: resolved to %q, %q (%v); want %q, %q", tc.role, tc.dialect, cfg.Role, cfg.Dialect, err, tc.want, cluster.SQLite)
		}
	}
	if _, err := cluster.ResolveConfig(cluster.Config{NodeID: "n1", DB: db, Role: "boss"}); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Errorf("Role \"boss\" = %v, want ErrInvalidConfig", err)
	}
	for _, d := range []cluster.Dialect{"POSTGRES", "MySQL", "SQLite"} {
		if _, err := cluster.SchemaSQL(d, ""); err != nil {
			t.Errorf("SchemaSQL(%q) = %v", d, err)
		}
		if _, err := cluster.NewSQLProvider(cluster.SQLPool(db), d, ""); err != nil {
			t.Errorf("NewSQLProvider(%q) = %v", d, err)
		}
	}
}
