#!/usr/bin/env bash
# How long PostgreSQL itself spent executing a handoff's statements during
# a bench run, from its own log: it sets log_min_duration_statement = 0
# (ALTER SYSTEM: a superuser's DSN), runs the bench command given, resets
# the setting, and reads the log lines the run added: the median execution
# time of the releases (those with a real fencing token; the leaders' runs
# ahead with token 0 apart) and of the first acquire statement after each
# release (the successor's grant). The execute time excludes the commit
# and its WAL flush, which PostgreSQL does at the protocol's Sync, and the
# time the statement spent travelling or waiting for a CPU.
#
#	cd bench && pgbench/serverlog.sh go run . compare -only handoff -systems pgx -pg-handoff notify -release shutdown -trials 40
#
# $PGLOG is the server's log file (default: the Debian cluster's), $DSN the
# database (default $CLUSTER_TEST_POSTGRES_DSN, else the local server).
set -euo pipefail
dsn=${DSN:-${CLUSTER_TEST_POSTGRES_DSN:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}}
log=${PGLOG:-$(ls /var/log/postgresql/postgresql-*-main.log | head -n 1)}
[ $# -gt 0 ] || { echo "usage: $0 bench command..." >&2; exit 2; }

setting() { psql "$dsn" -Atq -c "ALTER SYSTEM $1" -c "SELECT pg_reload_conf()" >/dev/null; }
start=$(($(wc -l <"$log") + 1))
setting "SET log_min_duration_statement = 0"
trap 'setting "RESET log_min_duration_statement"' EXIT
"$@"
setting "RESET log_min_duration_statement"
trap - EXIT

tail -n +"$start" "$log" | awk '
	function median(a, n,   i, j, t) {
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
		return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
	}
	function flush() {
		if (kind == "release" && detail !~ /\$4 = .0.$/) { rel[++nr] = dur; after = 1 }
		else if (kind == "acquire" && after) { grant[++ng] = dur; after = 0 }
		kind = ""; detail = ""
	}
	/ LOG: +duration: [0-9.]+ ms +execute / {
		flush()
		dur = $0; sub(/.*duration: /, "", dur); sub(/ ms.*/, "", dur); dur += 0
		inexec = 1
	}
	inexec && kind == "" {
		# The statement text, on this line or a continuation line.
		if ($0 ~ /_release\(/) kind = "release"; else if ($0 ~ /_acquire\(/) kind = "acquire"
	}
	/^\t/ { next }
	/ DETAIL: +parameters: / { detail = $0; inexec = 0; next }
	/ LOG: / && !/ execute / { flush(); inexec = 0 }
	END {
		flush()
		if (nr) printf "releases: %d, execute median %.3f ms\n", nr, median(rel, nr)
		if (ng) printf "grants after them: %d, execute median %.3f ms\n", ng, median(grant, ng)
	}'
