package main

import (
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlfence/cluster"
)

// drivers names the database/sql driver clusterctl opens for each dialect;
// main.go imports them.
var drivers = map[cluster.Dialect]string{
	cluster.Postgres: "pgx",
	cluster.MySQL:    "mysql",
	cluster.SQLite:   "sqlite",
}

// dialectHint says which DSN shapes inferDialect recognises, for errors.
const dialectHint = "postgres:// or postgresql:// (postgres), file: or a path ending in .db or .sqlite (sqlite), user@tcp(host:port)/db (mysql)"

// mysqlShape matches a go-sql-driver/mysql DSN: [user[:password]@][net[(addr)]]/dbname.
var mysqlShape = regexp.MustCompile(`^[^/]*@[a-z0-9]*(\(.*\))?/`)

// inferDialect names the dialect a DSN's shape implies, or "" when it
// implies none.
func inferDialect(dsn string) cluster.Dialect {
	lower := strings.ToLower(dsn)
	path, _, _ := strings.Cut(lower, "?")
	switch {
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		return cluster.Postgres
	case strings.HasPrefix(lower, "file:"),
		strings.HasSuffix(path, ".db"), strings.HasSuffix(path, ".sqlite"), strings.HasSuffix(path, ".sqlite3"):
		return cluster.SQLite
	case mysqlShape.MatchString(dsn):
		return cluster.MySQL
	}
	return ""
}

// sqlitePath returns the file a SQLite DSN names, or "" for an in-memory
// database.
func sqlitePath(dsn string) string {
	path, query, _ := strings.Cut(dsn, "?")
	if strings.HasPrefix(path, "file:") {
		path = strings.TrimPrefix(path, "file:")
		if strings.HasPrefix(path, "//") { // file://host/path: only an empty or local host
			path = strings.TrimPrefix(strings.TrimPrefix(path, "//"), "localhost")
		}
		if p, err := url.PathUnescape(path); err == nil {
			path = p
		}
	}
	if path == "" || path == ":memory:" || strings.Contains(query, "mode=memory") {
		return ""
	}
	return path
}

// withBusyTimeout adds busy_timeout(5000) to a SQLite DSN that sets no
// busy timeout, so clusterctl waits for the nodes' writes instead of
// failing with "database is locked".
func withBusyTimeout(dsn string) string {
	if strings.Contains(dsn, "busy_timeout") {
		return dsn
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "_pragma=busy_timeout(5000)"
}

// sqliteMissing reports whether a SQLite DSN names a file that does not
// exist, which opening it would create.
func sqliteMissing(dsn string) (string, bool) {
	path := sqlitePath(dsn)
	if path == "" {
		return "", false
	}
	_, err := os.Stat(path)
	return path, os.IsNotExist(err)
}

var (
	urlPassword = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://[^:/@]*:(.*)@`)
	kvPassword  = regexp.MustCompile(`(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]+)`)
)

// secrets returns every string that may be the password of dsn, however
// the DSN is written or mistyped, so that errors can be scrubbed of it.
// It errs on the side of finding too much.
func secrets(dsn string) []string {
	var out []string
	add := func(s string) {
		s = strings.Trim(s, "'")
		if s != "" {
			out = append(out, s)
			if u, err := url.PathUnescape(s); err == nil && u != s {
				out = append(out, u)
			}
		}
	}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		p, _ := u.User.Password()
		add(p)
	}
	if m := urlPassword.FindStringSubmatch(dsn); m != nil {
		add(m[1])
		first, _, _ := strings.Cut(m[1], "@")
		add(first)
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		add(m[1])
	}
	if !strings.Contains(dsn, "://") {
		if cfg, err := mysql.ParseDSN(dsn); err == nil {
			add(cfg.Passwd)
		}
		// user:password@...: the password runs from the first ":" to the
		// last "@" (go-sql-driver/mysql's own rule), or to the first "@".
		if at := strings.LastIndex(dsn, "@"); at > 0 {
			if _, pw, ok := strings.Cut(dsn[:at], ":"); ok {
				add(pw)
				first, _, _ := strings.Cut(pw, "@")
				add(first)
			}
		}
	}
	return out
}

// redact replaces every secret in msg with "xxxxx", the longest first, and
// folds msg onto one line.
func redact(msg string, secrets []string) string {
	secrets = slices.Clone(secrets)
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return strings.Join(strings.Fields(msg), " ")
}
