#!/usr/bin/env bash
# What a handoff's statements cost in a busy loop on one session, with the
# server's own commit (WAL flush) included: a grant through the acquire
# function, the release of that term through the release function, and
# SELECT 1 for the round trip alone. pgbench -r, prepared, 10 s.
#
#	bench/pgbench/handoff-statements.sh [postgres://... DSN]    (from the repository root)
#
# It creates the cluster tables under the prefix pgh_ with clusterctl and
# drops them at the end.
set -euo pipefail
prefix=pgh_
source "$(dirname "$0")/setup.sh"
cat >"$work/handoff.sql" <<'SQL'
\set n random(1, 1000000000)
SELECT granted FROM pgh_acquire('h', 'i' || :n, 2000, '', 'L');
SELECT instance FROM pgh_release('L', 'h', 'i' || :n, NULL);
SELECT 1;
SQL
echo "== grant, release, SELECT 1: statement mean latencies (ms), one session, 10 s"
pgbench "$dsn" -n -T 10 -r -M prepared -f "$work/handoff.sql" 2>&1 |
	sed -n '/statement latencies/,$p' | tail -n +2 | cut -c1-90
