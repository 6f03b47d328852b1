package cluster

import (
	"cmp"
	"database/sql"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cloudflare/circl/kem"

	"github.com/sqlfence/cluster/provider"
)

// Role says whether a node campaigns for the lease.
type Role string

const (
	// RoleLeader nodes campaign for the lease. It is the default.
	RoleLeader Role = "leader"
	// RoleFollower nodes never campaign; they answer discovery requests and
	// report who leads.
	RoleFollower Role = "follower"
)

// Dialect names the SQL dialect of [Config.DB].
type Dialect string

// The supported dialects.
const (
	Postgres Dialect = "postgres" // PostgreSQL 12 or later, through github.com/jackc/pgx/v5/stdlib
	SQLite   Dialect = "sqlite"   // SQLite 3.42 or later, through modernc.org/sqlite
	MySQL    Dialect = "mysql"    // MySQL 8.0 or MariaDB 10.5 or later, through github.com/go-sql-driver/mysql
)

// Defaults and limits of the [Config] fields.
const (
	DefaultLeaseTTL          = 30 * time.Second
	MinLeaseTTL              = time.Second
	MaxLeaseTTL              = 24 * time.Hour
	DefaultHeartbeatInterval = 10 * time.Second
	MinHeartbeatInterval     = 100 * time.Millisecond
	DefaultTablePrefix       = "cluster_"
	DefaultLeaseName         = "leader"
)

// Limits on identifiers stored in the lease row.
const (
	maxNodeIDLen    = 255
	maxLeaseNameLen = 128
	maxEndpointLen  = 2048
)

var prefixPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxIdentifierLen is the longest identifier PostgreSQL keeps
// (NAMEDATALEN-1), the strictest of the dialects: MySQL and MariaDB allow
// 64 bytes. PostgreSQL silently truncates a longer name, so two prefixes
// could build the same table.
const maxIdentifierLen = 63

// longestSchemaName is the longest name the schema builds from the table
// prefix, with "{{prefix}}" in place of it, and maxPrefixLen the longest
// TablePrefix for which every such name fits maxIdentifierLen. Both follow
// the embedded schema files, so a longer name added there lowers the limit.
var (
	longestSchemaName = schemaLongestName()
	maxPrefixLen      = maxIdentifierLen - (len(longestSchemaName) - len(prefixPlaceholder))
)

const prefixPlaceholder = "{{prefix}}"

// schemaLongestName scans the embedded schema files for the longest
// identifier of the form {{prefix}}[a-z0-9_]+.
func schemaLongestName() string {
	names, err := fs.Glob(schemaFS, "schema/*.sql")
	if err != nil || len(names) == 0 {
		panic("cluster: no embedded schema files") // a build defect, not input
	}
	ident := regexp.MustCompile(regexp.QuoteMeta(prefixPlaceholder) + `[a-z0-9_]+`)
	longest := ""
	for _, name := range names {
		b, err := schemaFS.ReadFile(name)
		if err != nil {
			panic("cluster: unreadable embedded " + name)
		}
		for _, m := range ident.FindAll(b, -1) {
			if len(m) > len(longest) {
				longest = string(m)
			}
		}
	}
	return longest
}

// Config configures a [Cluster]. Only NodeID and one of DB or Provider are
// required; every zero field takes the default its comment gives.
type Config struct {
	// NodeID names this node. It is required, must be stable across
	// restarts, and must be unique among the running nodes: a second process
	// with the same NodeID is refused the lease while the first holds it.
	// At most 255 bytes of printable UTF-8, not beginning or ending with a
	// space.
	NodeID string

	// Role is RoleLeader (the default) to campaign for the lease, or
	// RoleFollower to never lead. It is matched in any case ("LEADER").
	Role Role

	// LeaseName names the lease row, so several independent elections can
	// share one table. Default "leader"; at most 128 bytes of printable
	// UTF-8, not beginning or ending with a space: MySQL and MariaDB compare
	// names ignoring trailing spaces, and every accepted name must be a
	// lease of its own on every dialect.
	LeaseName string

	// LeaseTTL is how long a granted or renewed lease lasts by the database
	// clock; it bounds how long a crashed leader blocks a takeover.
	// Default 30s, minimum 1s, maximum 24h ([MaxLeaseTTL]), in whole
	// milliseconds. The maximum keeps every deadline derived from it on the
	// monotonic clock far from overflowing.
	LeaseTTL time.Duration

	// HeartbeatInterval is how often the leader renews its lease, and the
	// longest a follower waits between attempts to acquire it. Default
	// LeaseTTL/3, at most 10s; minimum 100ms; must be less than FenceTimeout.
	HeartbeatInterval time.Duration

	// FenceTimeout is how long after the start of its last successful
	// acquire or renew attempt a leader keeps believing it leads, measured on
	// its own monotonic clock. It must be greater than HeartbeatInterval, so
	// one slow renew does not end leadership, and less than LeaseTTL, so a
	// cut-off leader stops believing before another node can acquire the
	// lease. LeaseTTL - FenceTimeout is the margin for clock-rate drift and
	// scheduling delay. Default LeaseTTL - HeartbeatInterval.
	FenceTimeout time.Duration

	// ResignHoldOff is how long after its release a node that called
	// [Cluster.Resign] waits before it campaigns again, so that another node
	// can take the lease. Followers try at least once every 1.2
	// heartbeats (a random 80% to 120% of one), so the default,
	// HeartbeatInterval and a quarter, lets every one of them try first.
	// At most LeaseTTL; New logs a warning when it is below 1.2
	// heartbeats.
	ResignHoldOff time.Duration

	// Endpoint is this node's routable URL, published to the discovery
	// handler while this node leads. It must be an absolute https URL with a
	// host and without user info or fragment; http is allowed only with
	// AllowInsecureEndpoint. Optional.
	Endpoint string

	// AllowInsecureEndpoint allows an http:// Endpoint.
	AllowInsecureEndpoint bool

	// DB is the database that holds the lease. Required unless Provider is
	// set. The cluster tables are created in it by [New].
	DB *sql.DB

	// Dialect is the SQL dialect of DB, matched in any case ("POSTGRES").
	// When empty it is detected from DB's driver (pgx, lib/pq,
	// modernc.org/sqlite, mattn/go-sqlite3, ncruces/go-sqlite3 or
	// go-sql-driver/mysql).
	Dialect Dialect

	// TablePrefix prefixes the names of the cluster tables, and of their
	// triggers and constraints. Default "cluster_"; it must match
	// ^[a-z_][a-z0-9_]*$ and be short enough that the longest name built
	// from it fits PostgreSQL's 63-byte identifiers, so no dialect truncates
	// or refuses one. The limit follows the schema; [Config.Validate]'s
	// error for a longer prefix gives it.
	TablePrefix string

	// PollOnly turns off the watch of lease releases ([provider.ReleaseWatcher]:
	// PostgreSQL LISTEN with clusterpgx's providers, and the wake-ups of
	// nodes that share a provider): followers then poll every heartbeat.
	// Set it behind a transaction pooler such as PgBouncer in transaction
	// mode, where LISTEN cannot work.
	PollOnly bool

	// SkipMigrations makes New run no DDL: it checks that the cluster
	// tables exist at this build's [SchemaVersion] and fails with
	// [ErrSchema], saying what to run, if they do not. Set it when the
	// application's database role has no DDL rights and the schema is
	// applied by a migration tool ([SchemaSQL]) or `clusterctl migrate`.
	// Without it New also runs no DDL when the schema is current.
	SkipMigrations bool

	// Provider replaces the default provider over DB as the store of the
	// lease: a *DBProvider of another driver (clusterpgx.NewProvider), a
	// wrapper that embeds one, or a store of your own. When set, DB, Dialect
	// and TablePrefix are not used. Fence, Chains, WitnessFile and VaultKeys
	// need the provider's optional capabilities (Fencer, ChainStore,
	// StateStore); New refuses a Config that needs one the provider lacks.
	Provider provider.Provider

	// Events, when set, receives this node's transitions from the first,
	// New's own included; see [Cluster.Notify], whose rules it follows
	// (the Cluster never blocks sending to it).
	Events chan<- Event

	// Logger receives the cluster's log records: transitions at Info, the
	// first failure of a streak at Warn, retries at Debug. Default
	// slog.Default(), so renew failures and lost leases reach the
	// service's log with no set-up. Whatever its handler, durations are
	// written as text ("1.5s", not nanoseconds), an error on one line, and
	// an attribute without a value (a nil error) not at all.
	Logger *slog.Logger

	// Observer, when set, is called after every provider call this node
	// makes (acquire, renew, release, fence, and for lanes claim-lane,
	// renew-lanes, release-lane) with its kind, outcome and latency, to
	// feed metrics or traces without wrapping the provider. It runs on the
	// goroutine that made the call, the heartbeat's, the lane keeper's and
	// the caller's of Fence and ClaimLane among them: it must return
	// quickly and must not block.
	Observer func(Operation)

	// Chains lists the hash-chained tables whose tips [New], and every
	// acquisition, check for rollback; see [Cluster.AdvanceTip]. Needs a
	// provider that implements [provider.ChainStore], as the default ones do.
	Chains []Chain

	// WitnessFile, when set, is a local file in which this node records the
	// highest fencing token and chain tips it has seen, so that a restore of
	// the whole database (which brings back old tips too) is detected at
	// boot and at every acquisition. Written atomically and fsynced. Keep it
	// on the node's own disk, not in the database's backups.
	WitnessFile string

	// VaultKeys are this node's vault public keys, fingerprinted with
	// [VaultKeyFingerprint] in the order given. [New] refuses to join a
	// cluster that recorded another fingerprint. Only public keys are read.
	VaultKeys []kem.PublicKey

	// VaultKeyFingerprint is the fingerprint of keys of another kind, used
	// instead of VaultKeys: 128 lowercase hex characters.
	VaultKeyFingerprint string

	// AcceptVaultKeyRotation lets [New] adopt this node's fingerprint as
	// the cluster's when they differ, incrementing the rotation epoch,
	// instead of refusing with [ErrVaultKeyDrift]. Set it only while
	// rolling out rotated keys.
	AcceptVaultKeyRotation bool

	// ExpectedVaultKeyFingerprint narrows AcceptVaultKeyRotation to one
	// blessed fingerprint, so a stale or mistyped key file is still
	// refused. Requires AcceptVaultKeyRotation.
	ExpectedVaultKeyFingerprint string

	// MaxLanes caps how many lanes this node holds at once (see
	// [Cluster.ClaimLane]): a claim beyond it fails with [ErrLaneLimit],
	// and the keeper hands over any lane above it, as it does above the
	// node's fair share. It protects a node from taking more partitions
	// than it can work on. Default 0: no cap but the fair share. Must not
	// be negative.
	MaxLanes int

	// opts are the settings only this package's tests change.
	opts options
}

// Validate reports whether c, with its defaults applied, is a valid
// configuration. The error wraps [ErrInvalidConfig] and names the field, its
// value and the rule it breaks. [New] calls Validate first.
func (c Config) Validate() error {
	_, err := c.resolve()
	return err
}

// resolve returns c with its defaults applied, or the first rule it breaks.
// options are settings of a Config that only this package's tests
// change (export_test.go), kept out of the API and out of package state.
type options struct {
	// rowCheckEvery is how often a candidate whose lease statements
	// refresh its membership row (PostgreSQL's) checks that the row is
	// still its own: those statements cannot tell it that the row was
	// taken over (crashedRetention) while the node went unseen, paused or
	// cut off for a week. Zero means an hour: one statement an hour; the
	// first check after such a pause comes at the pause's end, as the
	// hour has passed.
	rowCheckEvery time.Duration
}

func (c Config) resolve() (Config, error) {
	if c.opts.rowCheckEvery <= 0 {
		c.opts.rowCheckEvery = time.Hour
	}
	if c.NodeID == "" {
		return c, configErrorf("NodeID is required")
	}
	if err := checkText("NodeID", c.NodeID, maxNodeIDLen); err != nil {
		return c, err
	}
	c.Role = Role(strings.ToLower(string(c.Role))) // "LEADER" is RoleLeader
	switch c.Role {
	case "":
		c.Role = RoleLeader
	case RoleLeader, RoleFollower:
	default:
		return c, configErrorf("Role (%q) must be %q or %q", c.Role, RoleLeader, RoleFollower)
	}
	c.LeaseName = cmp.Or(c.LeaseName, DefaultLeaseName)
	if err := checkText("LeaseName", c.LeaseName, maxLeaseNameLen); err != nil {
		return c, err
	}

	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	if c.LeaseTTL < MinLeaseTTL {
		return c, configErrorf("LeaseTTL (%v) must be at least %v", c.LeaseTTL, MinLeaseTTL)
	}
	if c.LeaseTTL > MaxLeaseTTL {
		return c, configErrorf("LeaseTTL (%v) must be at most %v", c.LeaseTTL, MaxLeaseTTL)
	}
	if c.LeaseTTL%time.Millisecond != 0 {
		return c, configErrorf("LeaseTTL (%v) must be a whole number of milliseconds", c.LeaseTTL)
	}
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, min(c.LeaseTTL/3, DefaultHeartbeatInterval))
	if c.HeartbeatInterval < MinHeartbeatInterval {
		return c, configErrorf("HeartbeatInterval (%v) must be at least %v", c.HeartbeatInterval, MinHeartbeatInterval)
	}
	if c.HeartbeatInterval >= c.LeaseTTL {
		return c, configErrorf("HeartbeatInterval (%v) must be less than LeaseTTL (%v)", c.HeartbeatInterval, c.LeaseTTL)
	}
	fenceDefault := ""
	if c.FenceTimeout == 0 {
		c.FenceTimeout = c.LeaseTTL - c.HeartbeatInterval
		fenceDefault = ", the default LeaseTTL - HeartbeatInterval"
	}
	if c.FenceTimeout <= c.HeartbeatInterval {
		return c, configErrorf("FenceTimeout (%v%s) must be greater than HeartbeatInterval (%v)", c.FenceTimeout, fenceDefault, c.HeartbeatInterval)
	}
	if c.FenceTimeout >= c.LeaseTTL {
		return c, configErrorf("FenceTimeout (%v) must be less than LeaseTTL (%v)", c.FenceTimeout, c.LeaseTTL)
	}

	c.ResignHoldOff = cmp.Or(c.ResignHoldOff, c.HeartbeatInterval+c.HeartbeatInterval/4)
	if c.ResignHoldOff < 0 || c.ResignHoldOff > c.LeaseTTL {
		return c, configErrorf("ResignHoldOff (%v) must be between 0 (the default, 1.25 × HeartbeatInterval) and LeaseTTL (%v)", c.ResignHoldOff, c.LeaseTTL)
	}

	if c.Endpoint != "" {
		if err := checkEndpoint(c.Endpoint, c.AllowInsecureEndpoint); err != nil {
			return c, err
		}
	}

	c.TablePrefix = cmp.Or(c.TablePrefix, DefaultTablePrefix)
	if !prefixPattern.MatchString(c.TablePrefix) {
		return c, configErrorf("TablePrefix (%q) must match %s", c.TablePrefix, prefixPattern)
	}
	if len(c.TablePrefix) > maxPrefixLen {
		return c, configErrorf("TablePrefix (%q, %d bytes) must be at most %d bytes: the longest table, trigger or constraint name built from it (%q) must fit PostgreSQL's %d-byte identifiers",
			c.TablePrefix, len(c.TablePrefix), maxPrefixLen, strings.Replace(longestSchemaName, prefixPlaceholder, c.TablePrefix, 1), maxIdentifierLen)
	}
	if c.Provider == nil {
		if c.DB == nil {
			return c, configErrorf("DB is required when Provider is nil")
		}
		c.Dialect = Dialect(strings.ToLower(string(c.Dialect))) // "POSTGRES" is Postgres
		detected, driver := detectDialect(c.DB)
		if c.Dialect == "" {
			if detected == "" {
				return c, configErrorf("Dialect is empty and driver %s is not one this package detects; set Dialect to %q, %q or %q", driver, Postgres, SQLite, MySQL)
			}
			c.Dialect = detected
		}
		if _, ok := dialects[c.Dialect]; !ok {
			return c, configErrorf("Dialect (%q) must be %q, %q or %q", c.Dialect, Postgres, SQLite, MySQL)
		}
		if detected != "" && detected != c.Dialect {
			return c, configErrorf("Dialect (%q) does not match DB, whose driver %s speaks %q", c.Dialect, driver, detected)
		}
	}
	chains, err := resolveChains(c.Chains)
	if err != nil {
		return c, err
	}
	c.Chains = chains
	if err := c.resolveVaultKeys(); err != nil {
		return c, err
	}
	if c.MaxLanes < 0 {
		return c, configErrorf("MaxLanes (%d) must not be negative; 0 means no cap but the fair share", c.MaxLanes)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if _, ok := c.Logger.Handler().(readableHandler); !ok {
		c.Logger = slog.New(readableHandler{c.Logger.Handler()})
	}
	return c, nil
}

// resolveVaultKeys fingerprints VaultKeys into VaultKeyFingerprint and
// checks the rotation settings.
func (c *Config) resolveVaultKeys() error {
	switch {
	case len(c.VaultKeys) > 0 && c.VaultKeyFingerprint != "":
		return configErrorf("VaultKeys and VaultKeyFingerprint are both set; set one")
	case len(c.VaultKeys) > 0:
		fp, err := VaultKeyFingerprint(c.VaultKeys...)
		if err != nil {
			msg := strings.TrimPrefix(err.Error(), ErrInvalidConfig.Error()+": ")
			return configErrorf("VaultKeys: %s", strings.TrimPrefix(msg, "cluster: "))
		}
		c.VaultKeyFingerprint = fp
	case c.VaultKeyFingerprint != "" && !ValidVaultKeyFingerprint(c.VaultKeyFingerprint):
		return configErrorf("VaultKeyFingerprint (%q) must be %d lowercase hex characters, as VaultKeyFingerprint returns", prefix(c.VaultKeyFingerprint, 32), VaultKeyFingerprintLen)
	}
	if c.ExpectedVaultKeyFingerprint != "" {
		if !ValidVaultKeyFingerprint(c.ExpectedVaultKeyFingerprint) {
			return configErrorf("ExpectedVaultKeyFingerprint (%q) must be %d lowercase hex characters", prefix(c.ExpectedVaultKeyFingerprint, 32), VaultKeyFingerprintLen)
		}
		if !c.AcceptVaultKeyRotation {
			return configErrorf("ExpectedVaultKeyFingerprint is set but AcceptVaultKeyRotation is false; set both to bless a rotation")
		}
	}
	if c.AcceptVaultKeyRotation && c.VaultKeyFingerprint == "" {
		return configErrorf("AcceptVaultKeyRotation is set but there are no VaultKeys or VaultKeyFingerprint")
	}
	return nil
}

// checkText validates an identifier stored in the lease row.
func checkText(field, s string, max int) error {
	if len(s) > max {
		return configErrorf("%s (%d bytes) must be at most %d bytes", field, len(s), max)
	}
	if !utf8.ValidString(s) {
		return configErrorf("%s (%q) must be valid UTF-8", field, s)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }); i >= 0 {
		return configErrorf("%s (%q) must not contain control or non-printing characters (found at byte %d)", field, s, i)
	}
	// The space is the only white space IsPrint lets through. MySQL and
	// MariaDB compare our utf8mb4_bin columns ignoring trailing spaces, so
	// "jobs" and "jobs " would name one row there and two elsewhere; a
	// leading space is refused too, so the rule is easy to state.
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return configErrorf("%s (%q) must not begin or end with a space: MySQL and MariaDB ignore trailing spaces when comparing names, so it would not be distinct from the name without them", field, s)
	}
	return nil
}

// checkEndpoint validates [Config.Endpoint].
func checkEndpoint(raw string, allowHTTP bool) error {
	if len(raw) > maxEndpointLen {
		return configErrorf("Endpoint (%d bytes) must be at most %d bytes", len(raw), maxEndpointLen)
	}
	if i := strings.IndexFunc(raw, func(r rune) bool { return r < 0x20 || r == 0x7f || unicode.IsSpace(r) }); i >= 0 {
		return configErrorf("Endpoint (%q) must not contain control characters or spaces (found at byte %d)", raw, i)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return configErrorf("Endpoint (%q) is not a URL: %v", raw, err)
	}
	switch {
	case !u.IsAbs():
		return configErrorf("Endpoint (%q) must be an absolute URL such as https://node-1.internal:8443", raw)
	case u.Scheme == "http" && !allowHTTP:
		return configErrorf("Endpoint (%q) uses http; use https or set AllowInsecureEndpoint", raw)
	case u.Scheme != "https" && u.Scheme != "http":
		return configErrorf("Endpoint (%q) has scheme %q; it must be https", raw, u.Scheme)
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return configErrorf("Endpoint (%q) must have a host", raw)
	case u.User != nil:
		return configErrorf("Endpoint (%q) must not contain user info", raw)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return configErrorf("Endpoint (%q) must not contain a fragment", raw)
	}
	return nil
}

// driverDialects names the dialect each known database/sql driver
// package speaks.
var driverDialects = map[string]Dialect{
	"github.com/jackc/pgx/v5/stdlib":       Postgres,
	"github.com/jackc/pgx/v4/stdlib":       Postgres,
	"github.com/lib/pq":                    Postgres,
	"modernc.org/sqlite":                   SQLite,
	"github.com/mattn/go-sqlite3":          SQLite,
	"github.com/ncruces/go-sqlite3/driver": SQLite,
	"github.com/go-sql-driver/mysql":       MySQL,
}

// detectDialect names the dialect spoken by db's driver, or "" when the
// driver is unknown, and returns the driver's package path for messages.
// It reads the driver type's package path: a type switch would import
// every driver above into every program that imports cluster (linking
// and registering them, cgo for mattn's), and the explicit option is
// Config.Dialect, which New asks for when the driver is not listed.
func detectDialect(db *sql.DB) (Dialect, string) {
	t := reflect.TypeOf(db.Driver())
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pkg := t.PkgPath()
	if d, ok := driverDialects[pkg]; ok {
		return d, pkg
	}
	return "", fmt.Sprintf("%s.%s", pkg, t.Name())
}
