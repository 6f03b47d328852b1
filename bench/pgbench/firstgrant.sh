#!/usr/bin/env bash
# What a PostgreSQL database session's first grant costs against a later
# one, and what the followers' warm-up saves, with pgbench on fresh
# sessions (-C: one connection per transaction, -r: per-statement mean
# latency). Each session plays a follower: one refused attempt (the lease
# is held), then a release by the holder and the follower's grant (its
# first), then a release and a second grant (warm). The second script runs
# the warm-up (the "warm" query) after the refused attempt, as a follower
# of this package does.
#
#	bench/pgbench/firstgrant.sh [postgres://... DSN]    (from the repository root)
#
# It creates the cluster tables under the prefix pgb_ with clusterctl and
# drops them at the end.
set -euo pipefail
prefix=pgb_
source "$(dirname "$0")/setup.sh"
psql "$dsn" -qc "INSERT INTO pgb_lease (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint) VALUES ('x', 'h', 'i', 1, 0, 0, 0, '') ON CONFLICT DO NOTHING"

# query NAME: the named query of schema/postgres_queries.sql on one line,
# comments dropped, for the prefix pgb_.
query() {
	awk -v n="$1" '$0 == "-- name: " n {f=1; next} f && /^-- name:/ {exit} f && !/^[ \t]*--/' \
		"$root/schema/postgres_queries.sql" | sed 's/{{prefix}}/pgb_/g' | tr '\n' ' ' | sed 's/;[[:space:]]*$//'
}
acquire=$(query acquire)
grant=$(printf '%s' "$acquire" | sed "s/\$1/'h'/g; s/\$2/'i'/g; s/\$3/2000/g; s/\$4/''/g; s/\$5/'x'/g")
warm=$(query warm)
warm=${warm//'{{acquire}}'/$acquire}
warm=${warm//'{{scratch}}'/0123456789abcdef}
hold="UPDATE pgb_lease SET expires_at = 9000000000000000 WHERE name = 'x';"
free="UPDATE pgb_lease SET expires_at = 0 WHERE name = 'x';"

printf '%s\n%s;\n%s\n%s;\n%s\n%s;\n' "$hold" "$grant" "$free" "$grant" "$free" "$grant" >"$work/cold.sql"
printf '%s\n%s;\n%s;\n%s\n%s;\n%s\n%s;\n' "$hold" "$grant" "$warm" "$free" "$grant" "$free" "$grant" >"$work/warmed.sql"

for script in cold warmed; do
	echo "== $script: statement mean latencies (ms) over 200 fresh sessions"
	pgbench "$dsn" -n -C -r -t 200 -f "$work/$script.sql" 2>&1 |
		sed -n '/statement latencies/,$p' | tail -n +2 | cut -c1-80
done
