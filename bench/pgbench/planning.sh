#!/usr/bin/env bash
# What PostgreSQL spends planning the acquire and release statements, in
# the checkout this script belongs to (run it in two checkouts to compare
# schema versions): EXPLAIN (ANALYZE, SUMMARY) of the acquire statement,
# prepared, refused eight times on one fresh session (a statement with
# parameters is planned anew at each of its first five runs, unless the
# schema's functions plan it once), then pgbench -r of the release and of
# a grant (literals: planned at every run, unless in a function).
#
#	bench/pgbench/planning.sh [postgres://... DSN]    (from the repository root)
#
# It creates the cluster tables under the prefix pgp_ with clusterctl and
# drops them at the end.
set -euo pipefail
prefix=pgp_
source "$(dirname "$0")/setup.sh"
psql "$dsn" -qc "INSERT INTO pgp_lease (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint) VALUES
	('held', 'h', 'i', 1, 0, 0, 9000000000000000, ''), ('free', 'h', 'i', 1, 0, 0, 0, '')"

# query NAME: the named query of schema/postgres_queries.sql on one line,
# comments dropped, for the prefix pgp_.
query() {
	awk -v n="$1" '$0 == "-- name: " n {f=1; next} f && /^-- name:/ {exit} f && !/^[ \t]*--/' \
		"$root/schema/postgres_queries.sql" | sed 's/{{prefix}}/pgp_/g' | tr '\n' ' ' | sed 's/;[[:space:]]*$//'
}
acquire=$(query acquire)
release=$(query release)
release=${release//'{{notify_released}}'/$(query notify_released 2>/dev/null || true)}

echo "== acquire, prepared, refused: planning and execution time of runs 1 to 8 on one session"
{
	echo "PREPARE acq(text, text, bigint, text, text) AS $acquire;"
	for _ in 1 2 3 4 5 6 7 8; do
		echo "EXPLAIN (ANALYZE, SUMMARY, COSTS OFF, TIMING OFF) EXECUTE acq('h2', 'i2', 2000, '', 'held');"
	done
} | psql "$dsn" -q 2>&1 | grep -E 'Planning Time|Execution Time' | paste - - | sed 's/^ *//'

grant=$(printf '%s' "$acquire" | sed "s/\$1/'h'/g; s/\$2/'i'/g; s/\$3/2000/g; s/\$4/''/g; s/\$5/'free'/g")
printf "UPDATE pgp_lease SET expires_at = 0 WHERE name = 'free';\n%s;\n" "$grant" >"$work/grant.sql"
printf "UPDATE pgp_lease SET expires_at = 9000000000000000, holder = 'h', instance = 'i' WHERE name = 'held';\n%s;\n" \
	"$(printf '%s' "$release" | sed "s/\$1/'held'/g; s/\$2/'h'/g; s/\$3/'i'/g; s/\$4/1/g")" >"$work/release.sql"
for script in release grant; do
	echo "== $script: statement mean latencies (ms), one session, 4 s"
	pgbench "$dsn" -n -T 4 -r -f "$work/$script.sql" 2>&1 |
		sed -n '/statement latencies/,$p' | tail -n +2 | cut -c1-80
done
