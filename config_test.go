package cluster_test

import (
	"context"
	"database/sql"
	"errors"
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
		{"bad role", func(c *cluster.Config) { c.Role = "boss" }, []string{"Role", `"boss"`, `"leader"`, `"follower"`}},
		{"lease name control char", func(c *cluster.Config) { c.LeaseName = "x\x00" }, []string{"LeaseName", "control"}},
		{"lease name too long", func(c *cluster.Config) { c.LeaseName = strings.Repeat("x", 129) }, []string{"LeaseName", "129 bytes", "128"}},
		{"ttl too short", func(c *cluster.Config) { c.LeaseTTL = 500 * time.Millisecond }, []string{"LeaseTTL", "500ms", "1s"}},
		{"ttl negative", func(c *cluster.Config) { c.LeaseTTL = -time.Second }, []string{"LeaseTTL", "-1s", "at least 1s"}},
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
		{"prefix uppercase", func(c *cluster.Config) { c.TablePrefix = "Cluster_" }, []string{"TablePrefix", `"Cluster_"`, "^[a-z_][a-z0-9_]{0,39}$"}},
		{"prefix injection", func(c *cluster.Config) { c.TablePrefix = "x; DROP TABLE y; --" }, []string{"TablePrefix"}},
		{"prefix too long", func(c *cluster.Config) { c.TablePrefix = strings.Repeat("a", 41) }, []string{"TablePrefix"}},
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
		"explicit dialect": {NodeID: "n1", DB: db, Dialect: cluster.SQLite},
		"unicode node id":  {NodeID: "nœud-1", DB: db},
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
// to store in the lease row and to use in SQL.
func FuzzConfigValidate(f *testing.F) {
	f.Add("node-1", "https://node-1.internal:8443", "cluster_", "leader")
	f.Add("", "http://x", "Cluster", "")
	f.Add("n\x00", "https://u@h/#f", "a;drop", "l\n")
	f.Add("nœud", "https://[::1]:8443/p?q=1", "_x9", "élection")
	f.Fuzz(func(t *testing.T, nodeID, endpoint, prefix, lease string) {
		cfg := cluster.Config{NodeID: nodeID, Endpoint: endpoint, TablePrefix: prefix, LeaseName: lease, Provider: &fakeProvider{}}
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
		if prefix != "" && !regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`).MatchString(prefix) {
			t.Fatalf("accepted TablePrefix %q", prefix)
		}
		if endpoint != "" {
			u, err := url.Parse(endpoint)
			if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.User != nil || strings.ContainsAny(endpoint, "#\r\n ") {
				t.Fatalf("accepted Endpoint %q", endpoint)
			}
		}
	})
}
