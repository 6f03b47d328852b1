# Sourced by the scripts of this directory, with $prefix set: it reads the
# DSN from the first argument (or $CLUSTER_TEST_POSTGRES_DSN, or the local
# server), sets $dsn, $root (the repository) and $work (a temporary
# directory), creates the cluster tables under $prefix with clusterctl, and
# on exit drops every table and function under $prefix and removes $work.
set -euo pipefail
dsn=${1:-${CLUSTER_TEST_POSTGRES_DSN:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d)
cleanup() {
	psql "$dsn" -Atc "SELECT format('DROP TABLE IF EXISTS %I CASCADE;', table_name) FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_name LIKE '${prefix%_}\_%'
		UNION ALL SELECT format('DROP FUNCTION IF EXISTS %s;', oid::regprocedure) FROM pg_proc
		WHERE pronamespace = current_schema()::regnamespace AND proname LIKE '${prefix%_}\_%'" | psql "$dsn" -q >/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
(cd "$root" && go run ./cmd/clusterctl migrate -dsn "$dsn" -prefix "$prefix")
