// Command clusterctl inspects and operates the lease of a
// github.com/sqlfence/cluster cluster through the database that holds it:
// who leads and until when by the database clock, the members, the lanes
// and who holds them, the chain tips and the recorded vault-key
// fingerprint; it ends a term or a lane's claim by force, retires a lease,
// and creates, upgrades or prints the cluster tables.
//
//	Usage: clusterctl <command> [flags]
//
// Run clusterctl help for the commands, flags and exit statuses, and
// clusterctl <command> -h for one command.
package main

import (
	"bufio"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/sqlfence/cluster"
)

// Exit statuses.
const (
	exitOK    = 0 // done
	exitFail  = 1 // the command failed: database unreachable, tables missing, lease held, not confirmed
	exitUsage = 2 // bad usage: unknown command or flag, missing -dsn, release without -force
)

// EnvDSN names the environment variable -dsn defaults to.
const EnvDSN = "CLUSTER_DSN"

// Flag defaults.
const (
	defaultTimeout = 10 * time.Second
	// defaultNodeTimeout is how long a member may go unseen before it is
	// not live, as the library computes it for its default timings:
	// LeaseTTL (30s) plus three heartbeats (10s each).
	defaultNodeTimeout = cluster.DefaultLeaseTTL + 3*cluster.DefaultHeartbeatInterval
)

const usage = `Usage: clusterctl <command> [flags]

Inspect and operate the lease of a github.com/sqlfence/cluster cluster
through the database that holds it. Flags go after the command.

Commands:
  status       the leader (node, endpoint, fencing token, expiry by the
               database clock and time left), then the members
  members      the members: node, instance, host, pid, status, live,
               leader, last seen
  lanes        every lane of the lease: key, holder, instance, fencing
               token, expiry by the database clock and time left, or free
  tips         every chain tip: chain, lease, counter, fencing token, hash
  fingerprint  the recorded vault-key fingerprint (prefix), its rotation
               epoch, and which node recorded it when
  release      end the current term at once, by the database clock (or,
               with -lane, the current claim on a lane); needs -force,
               and asks for confirmation unless -yes
  forget NODE  remove a dead node's membership rows; refused while it is
               live; asks unless -yes
  retire       retire the lease: no holder, fencing token kept, members
               marked left; refused while a node holds it; asks unless -yes
  migrate      create or upgrade the cluster tables; print the schema version
  schema       print the DDL of the cluster tables (no database needed)
  help         print this text; clusterctl <command> -h describes a command

Flags:
  -dsn DSN            the database (default $CLUSTER_DSN):
                        postgres://user:pass@host:5432/db   (pgx)
                        user:pass@tcp(host:3306)/db         (MySQL/MariaDB)
                        file:/path/app.db or /path/app.db   (SQLite; a
                        busy_timeout of 5s is added unless the DSN sets one)
  -dialect NAME       postgres, mysql or sqlite (default: from the DSN's
                      shape: postgres:// or postgresql://; file: or a path
                      ending in .db or .sqlite; user@tcp(host:port)/db)
  -prefix PREFIX      prefix of the cluster tables (default "cluster_")
  -lease NAME         lease name (default "leader"); not for tips, migrate,
                      schema
  -timeout DURATION   bound on the command's database work (default 10s);
                      not for schema
  -json               print one JSON document; not for schema
  -node-timeout DUR   status, members, forget: a member is live while the
                      database saw it within the node timeout it recorded
                      (its LeaseTTL and three heartbeats); this one judges
                      a row that recorded none (default 60s, the library's
                      for LeaseTTL 30s and heartbeat 10s)
  -lane KEY           release: end the claim on lane KEY, not the lease's
                      term
  -force              release: required
  -yes                release, retire, forget: do not ask for confirmation

Exit status: 0 done; 1 failed (database unreachable or refusing, tables
missing, lease held, not confirmed); 2 bad usage.
`

// flagKind names the optional flags a command takes.
type flagKind uint

const (
	timeoutFlag     flagKind = 1 << iota // -timeout (every command that connects)
	leaseFlag                            // -lease
	jsonFlag                             // -json
	nodeTimeoutFlag                      // -node-timeout
	forceFlag                            // -force
	yesFlag                              // -yes
	laneFlag                             // -lane
	nodeArg                              // one argument: the node ID (forget)
)

// A command is one subcommand of clusterctl.
type command struct {
	name  string
	about string // what it does, for clusterctl <command> -h
	flags flagKind
	run   func(ctx context.Context, e *env) error
}

var commands = []*command{
	{"status", "Print the leader (node, endpoint, fencing token, expiry by the database clock\nand time left), then the members.",
		timeoutFlag | leaseFlag | jsonFlag | nodeTimeoutFlag, runStatus},
	{"members", "Print the members of the lease: node, instance, host, pid, status, live,\nleader, and how long ago the database last saw them.",
		timeoutFlag | leaseFlag | jsonFlag | nodeTimeoutFlag, runMembers},
	{"lanes", "Print every lane of the lease: key, holder (node and instance), fencing\ntoken, expiry by the database clock and time left; a free lane (released or\nexpired) keeps its token, and its next claim gets a higher one.",
		timeoutFlag | leaseFlag | jsonFlag, runLanes},
	{"tips", "Print every chain tip: chain, lease, counter, fencing token, hash (prefix).",
		timeoutFlag | jsonFlag, runTips},
	{"fingerprint", "Print the vault-key fingerprint the cluster recorded (its first 16 hex\ncharacters), its rotation epoch, and which node recorded it when.",
		timeoutFlag | leaseFlag | jsonFlag, runFingerprint},
	{"release", "End the current term of the lease at once, by the database clock. Its\nfencing token is kept: the next term gets a higher one, and the database\nrefuses fenced writes under the old one from now on. The node that held it\nstops believing it leads when its trust window closes. With -lane KEY it\nends the current claim on that lane instead, whoever holds it, keeping its\ntoken: any node may claim it at once, under a higher token, and its holder\nlearns of it at its next claim or heartbeat; a transaction holding the lane\ndelays the release until it ends (PostgreSQL, MySQL). Needs -force; asks\nfor confirmation on stdin unless -yes.",
		timeoutFlag | leaseFlag | jsonFlag | forceFlag | yesFlag | laneFlag, runRelease},
	{"forget", "Remove the membership rows of a dead node (the argument, a NodeID): left,\nor not seen within -node-timeout by the database clock. Refused while the\nnode is live. A process forgotten while in fact alive (paused for longer)\njoins again at its next refresh. Asks for confirmation on stdin unless -yes.",
		timeoutFlag | leaseFlag | jsonFlag | nodeTimeoutFlag | yesFlag | nodeArg, runForget},
	{"retire", "Retire the lease: its row stays, with its fencing token (a name used again\ncontinues from it), but names no holder, and its members are marked left.\nRefused while a node holds it: stop its nodes first. Asks for confirmation\non stdin unless -yes.",
		timeoutFlag | leaseFlag | jsonFlag | yesFlag, runRetire},
	{"migrate", "Create the cluster tables, or upgrade them to this build's schema version,\nand print the schema version. Runs no DDL when they are current.",
		timeoutFlag | jsonFlag, runMigrate},
	{"schema", "Print the DDL of the cluster tables for -dialect (or the dialect of -dsn)\nand -prefix, for a migration tool or a DBA. Connects to nothing.",
		0, runSchema},
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// options are the values of the flags.
type options struct {
	dsn, dialect, prefix, lease, lane string
	timeout, nodeTimeout              time.Duration
	json, force, yes                  bool
	node                              string // forget's argument
}

// flagSet returns c's flags, bound to o.
func (c *command) flagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("clusterctl "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.dsn, "dsn", "", "the database `DSN` (default $"+EnvDSN+")")
	fs.StringVar(&o.dialect, "dialect", "", "postgres, mysql or sqlite (default: from the DSN's shape)")
	fs.StringVar(&o.prefix, "prefix", cluster.DefaultTablePrefix, "`prefix` of the cluster tables")
	if c.flags&leaseFlag != 0 {
		fs.StringVar(&o.lease, "lease", cluster.DefaultLeaseName, "lease `name`")
	}
	if c.flags&timeoutFlag != 0 {
		fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "bound on the command's database work")
	}
	if c.flags&jsonFlag != 0 {
		fs.BoolVar(&o.json, "json", false, "print one JSON document")
	}
	if c.flags&nodeTimeoutFlag != 0 {
		fs.DurationVar(&o.nodeTimeout, "node-timeout", defaultNodeTimeout,
			"a member not seen for this long, by the database clock, is not live\n(the library's default for LeaseTTL 30s and heartbeat 10s)")
	}
	if c.flags&laneFlag != 0 {
		fs.StringVar(&o.lane, "lane", "", "end the claim on lane `key` instead of the lease's term")
	}
	if c.flags&forceFlag != 0 {
		fs.BoolVar(&o.force, "force", false, "required: end the term")
	}
	if c.flags&yesFlag != 0 {
		fs.BoolVar(&o.yes, "yes", false, "do not ask for confirmation")
	}
	return fs
}

func (c *command) printUsage(w io.Writer, fs *flag.FlagSet) {
	arg := ""
	if c.flags&nodeArg != 0 {
		arg = " NODE"
	}
	fmt.Fprintf(w, "Usage: clusterctl %s [flags]%s\n\n%s\n\nFlags:\n", c.name, arg, c.about)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// A usageError is bad usage: exit status 2.
type usageError struct {
	msg       string
	showUsage bool // print the command's usage after msg
}

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// env is what a command runs with.
type env struct {
	cmd            *command
	opts           options
	stdin          *bufio.Reader
	stdout, stderr io.Writer
	secrets        []string // what may be the DSN's password, scrubbed from errors

	dialect cluster.Dialect
	db      *sql.DB
	p       *cluster.DBProvider
}

// bounded returns ctx bounded by -timeout.
func (e *env) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.opts.timeout)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run runs clusterctl with args and returns its exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			c := lookup(args[1])
			if c == nil {
				fmt.Fprintf(stderr, "clusterctl: unknown command %q\n\n%s", args[1], usage)
				return exitUsage
			}
			c.printUsage(stdout, c.flagSet(new(options)))
			return exitOK
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	c := lookup(args[0])
	if c == nil {
		if strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(stderr, "clusterctl: flags go after the command, not before it (%s)\n\n%s", args[0], usage)
		} else {
			fmt.Fprintf(stderr, "clusterctl: unknown command %q\n\n%s", args[0], usage)
		}
		return exitUsage
	}

	e := &env{cmd: c, stdin: bufio.NewReader(stdin), stdout: stdout, stderr: stderr}
	fs := c.flagSet(&e.opts)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.printUsage(stdout, fs)
			return exitOK
		}
		fmt.Fprintf(stderr, "clusterctl %s: %v\n\n", c.name, err)
		c.printUsage(stderr, fs)
		return exitUsage
	}
	e.opts.dsn = cmp.Or(e.opts.dsn, os.Getenv(EnvDSN))
	e.secrets = secrets(e.opts.dsn)
	err := e.check(fs)
	if err == nil {
		err = e.runCommand()
	}
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "clusterctl %s: %s\n", c.name, redact(ue.msg, e.secrets))
		if ue.showUsage {
			fmt.Fprintln(stderr)
			c.printUsage(stderr, fs)
		}
		return exitUsage
	default:
		fmt.Fprintf(stderr, "clusterctl: %s\n", redact(err.Error(), e.secrets))
		return exitFail
	}
}

// check validates the flags that need no database.
func (e *env) check(fs *flag.FlagSet) error {
	args := fs.Args()
	if e.cmd.flags&nodeArg != 0 {
		if len(args) == 0 || args[0] == "" {
			return &usageError{msg: "which node? give its NodeID", showUsage: true}
		}
		e.opts.node = args[0]
		// Flags may follow the node too: clusterctl forget api-2 -yes.
		if err := fs.Parse(args[1:]); err != nil {
			return &usageError{msg: err.Error(), showUsage: true}
		}
		args = fs.Args()
	}
	if len(args) > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", args[0]), showUsage: true}
	}
	if e.cmd.flags&leaseFlag != 0 && e.opts.lease == "" {
		return usagef("-lease is empty")
	}
	if e.cmd.flags&timeoutFlag != 0 && e.opts.timeout <= 0 {
		return usagef("-timeout (%v) must be positive", e.opts.timeout)
	}
	if e.cmd.flags&nodeTimeoutFlag != 0 && e.opts.nodeTimeout <= 0 {
		return usagef("-node-timeout (%v) must be positive", e.opts.nodeTimeout)
	}
	return nil
}

// runCommand runs the command, quietly: the library's log records are
// about the nodes' roles and timings, not clusterctl's, so only errors
// reach stderr.
func (e *env) runCommand() error {
	slog.SetDefault(slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	mysql.SetLogger(quietLogger{})
	defer func() {
		if e.db != nil {
			e.db.Close()
		}
	}()
	return e.cmd.run(context.Background(), e)
}

// quietLogger discards go-sql-driver/mysql's log lines (a connection
// dropped, say), which would break clusterctl's one-line errors; the
// error itself is returned.
type quietLogger struct{}

func (quietLogger) Print(...any) {}
