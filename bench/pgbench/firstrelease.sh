#!/usr/bin/env bash
# What a PostgreSQL database session's first real release costs against a
# later one, with pgbench on fresh sessions (-C: one connection per
# transaction, -r: per-statement mean latency). Each session plays a
# leader: its grant, the run ahead a leader makes at its term's first
# renew (the release statement with fencing token 0, which matches no
# row), a renew, then three releases of a term of its own, each after a
# grant. The second script also rehearses a whole release first: a scratch
# lease granted and released in a subtransaction rolled back (nothing is
# left and nothing notifies), which a leader does not do.
#
#	bench/pgbench/firstrelease.sh [postgres://... DSN]    (from the repository root)
#
# pgbench's -M (simple by default) comes from $MODE, so MODE=prepared runs
# the statements prepared, as pgx does. It creates the cluster tables under
# the prefix pgr_ with clusterctl and drops them at the end.
set -euo pipefail
prefix=pgr_
source "$(dirname "$0")/setup.sh"

grant="SELECT granted FROM pgr_acquire('h', 'i' || :n, 2000, '', 'L');"
release="SELECT instance FROM pgr_release('L', 'h', 'i' || :n, NULL);"
{
	echo '\set n random(1, 1000000000)'
	echo "$grant"
	echo "SELECT instance FROM pgr_release('L', 'h', 'i' || :n, 0);"
	echo "UPDATE pgr_lease SET renewed_at = renewed_at WHERE name = 'L' AND instance = 'i' || :n;"
	printf '%s\n%s\n%s\n%s\n%s\n' "$release" "$grant" "$release" "$grant" "$release"
} >"$work/ahead.sql"
rehearse="DO \$w\$ BEGIN PERFORM set_config('synchronous_commit', 'off', true); BEGIN PERFORM * FROM pgr_acquire('', ' r', 2000, '', ' rehearsal'); PERFORM * FROM pgr_release(' rehearsal', '', ' r', NULL); RAISE EXCEPTION 'rehearsed'; EXCEPTION WHEN OTHERS THEN NULL; END; END \$w\$;"
awk -v r="$rehearse" '{print} NR == 3 {print r}' "$work/ahead.sql" >"$work/rehearsed.sql"

for script in ahead rehearsed; do
	echo "== $script: statement mean latencies (ms) over 300 fresh sessions, -M ${MODE:-simple}"
	pgbench "$dsn" -n -C -r -t 300 -M "${MODE:-simple}" -f "$work/$script.sql" 2>&1 |
		sed -n '/statement latencies/,$p' | tail -n +2 | cut -c1-90
done
