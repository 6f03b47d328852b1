-- Queries of the default provider on PostgreSQL. Each starts at a
-- "-- name:" line and is loaded into a field of the dialect's queries
-- struct (dialect.go); a name missing here, or one no field takes, fails at
-- load. A name does the same thing in every dialect and takes its
-- arguments in the same order, given on its "-- args:" line.
-- The clock CTE reads clock_timestamp() once, so one statement sees one
-- instant (now() would be the start of the transaction).

-- name: acquire
-- args: holder, instance, ttl ms, endpoint, name.
-- Grants a new term if the lease is free or expired, else reports the
-- holder: granted, holder, instance, token, expires, endpoint, now.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), seen AS (
    -- The attempt is also this node's membership heartbeat: no extra
    -- statement.
    UPDATE {{prefix}}nodes SET last_seen = (SELECT now_ms FROM clock)
    WHERE scope = $5 AND instance = $2 AND status = 'active'
), granted AS (
    INSERT INTO {{prefix}}lease AS l
        (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint)
    SELECT $5, $1, $2,
           COALESCE((SELECT value FROM {{prefix}}high_water WHERE scope = 'lease/' || $5), 0) + 1,
           now_ms, now_ms, now_ms + $3::bigint, $4
    FROM clock
    ON CONFLICT (name) DO UPDATE SET
        holder        = excluded.holder,
        instance      = excluded.instance,
        fencing_token = l.fencing_token + 1,
        acquired_at   = excluded.acquired_at,
        renewed_at    = excluded.renewed_at,
        expires_at    = excluded.expires_at,
        endpoint      = excluded.endpoint
    WHERE l.expires_at <= excluded.acquired_at
    RETURNING l.holder, l.instance, l.fencing_token, l.expires_at, l.endpoint
)
SELECT true, g.holder, g.instance, g.fencing_token, g.expires_at, g.endpoint, c.now_ms
FROM granted g, clock c
UNION ALL
SELECT false, l.holder, l.instance, l.fencing_token, l.expires_at, l.endpoint, c.now_ms
FROM {{prefix}}lease l, clock c
WHERE l.name = $5 AND NOT EXISTS (SELECT 1 FROM granted);

-- name: renew
-- args: ttl ms, name, holder, instance, token. Returns the new expiry. The
-- renew is also the leader's membership heartbeat.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), seen AS (
    UPDATE {{prefix}}nodes SET last_seen = (SELECT now_ms FROM clock)
    WHERE scope = $2 AND instance = $4 AND status = 'active'
)
UPDATE {{prefix}}lease AS l
SET renewed_at = c.now_ms, expires_at = c.now_ms + $1::bigint
FROM clock c
WHERE l.name = $2 AND l.holder = $3 AND l.instance = $4 AND l.fencing_token = $5
  AND l.expires_at > c.now_ms
RETURNING l.expires_at;

-- name: release
-- args: name, holder, instance, token. A release that ends a term tells
-- the listening followers at once (NOTIFY on channel {{prefix}}lease, the
-- lease name as payload; delivered when the statement commits).
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), released AS (
    UPDATE {{prefix}}lease AS l
    SET renewed_at = c.now_ms, expires_at = c.now_ms
    FROM clock c
    WHERE l.name = $1 AND l.holder = $2 AND l.instance = $3 AND l.fencing_token = $4
      AND l.expires_at > c.now_ms
    RETURNING l.name
)
SELECT pg_notify('{{prefix}}lease', name) FROM released;

-- name: release_instance
-- args: name, holder, instance. Releases whatever term the instance holds.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), released AS (
    UPDATE {{prefix}}lease AS l
    SET renewed_at = c.now_ms, expires_at = c.now_ms
    FROM clock c
    WHERE l.name = $1 AND l.holder = $2 AND l.instance = $3
      AND l.expires_at > c.now_ms
    RETURNING l.name
)
SELECT pg_notify('{{prefix}}lease', name) FROM released;

-- name: leader
-- args: name. Returns holder, instance, token, expires, endpoint, now.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM {{prefix}}lease WHERE name = $1;

-- name: lease_token
-- args: name.
SELECT fencing_token FROM {{prefix}}lease WHERE name = $1;

-- name: fence
-- args: name, timeout ms. Returns what leader returns. FOR SHARE holds the
-- row until the caller's transaction ends, so no later term can be
-- granted before its writes commit. The set_config calls run before the
-- row lock is taken and last until the transaction ends: the wait for the
-- lock, and any idle moment of the transaction (its client vanished), are
-- bounded by the timeout.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM {{prefix}}lease
WHERE name = $1
  AND set_config('lock_timeout', $2::text, true) IS NOT NULL
  AND set_config('idle_in_transaction_session_timeout', $2::text, true) IS NOT NULL
FOR SHARE;

-- name: tip_read
-- args: scope. Returns counter, hash, token, lease name.
SELECT at_counter, row_hash, fencing_token, lease_name FROM {{prefix}}chain_tips WHERE scope = $1;

-- name: tip_write
-- args: scope, lease name, counter, hash, token.
-- The guard trigger refuses a stale token or a counter moving backwards.
INSERT INTO {{prefix}}chain_tips (scope, lease_name, at_counter, row_hash, fencing_token, updated_at)
VALUES ($1, $2, $3, $4, $5, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (scope) DO UPDATE SET
    lease_name    = excluded.lease_name,
    at_counter    = excluded.at_counter,
    row_hash      = excluded.row_hash,
    fencing_token = excluded.fencing_token,
    updated_at    = excluded.updated_at;

-- name: mark_read
-- args: scope ('lease/<name>' or 'chain/<name>'). The high-water mark.
SELECT value FROM {{prefix}}high_water WHERE scope = $1;

-- name: chain_top
-- args: none. {{table}} and {{counter}} are a chain's validated names.
SELECT MAX({{counter}}) FROM {{table}};

-- name: chain_hash_at
-- args: counter. {{table}}, {{counter}} and {{hash}} are validated names.
SELECT {{hash}} FROM {{table}} WHERE {{counter}} = $1;

-- name: version_read
-- args: none.
SELECT MAX(version) FROM {{prefix}}schema_version;

-- name: version_write
-- args: version.
INSERT INTO {{prefix}}schema_version (version, applied_at)
VALUES ($1, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (version) DO NOTHING;

-- name: state_insert
-- args: scope, fingerprint, node.
INSERT INTO {{prefix}}state (scope, vault_key_fp, rotation_epoch, recorded_at, recorded_by_node)
VALUES ($1, $2, 0, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, $3)
ON CONFLICT (scope) DO NOTHING;

-- name: state_read
-- args: scope. Returns fingerprint, epoch, recorded at, recorded by.
SELECT vault_key_fp, rotation_epoch, recorded_at, recorded_by_node FROM {{prefix}}state WHERE scope = $1;

-- name: state_rotate
-- args: new fingerprint, node, scope, old fingerprint (compare-and-set).
UPDATE {{prefix}}state
SET vault_key_fp = $1, rotation_epoch = rotation_epoch + 1,
    recorded_at = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, recorded_by_node = $2
WHERE scope = $3 AND vault_key_fp = $4;

-- name: current_schema
-- args: none. The schema the tables are created in.
SELECT current_schema();

-- name: schema_lock
-- args: lock key, lock timeout ms. Run inside the schema transaction: the
-- advisory lock ends with it, and lock_timeout keeps the DDL from queueing
-- behind an open transaction on the cluster tables.
SELECT pg_advisory_xact_lock(hashtext($1)), set_config('lock_timeout', $2::text, true);

-- name: node_join
-- args: scope, instance, node id, host, pid, endpoint.
INSERT INTO {{prefix}}nodes AS m (scope, instance, node_id, host, pid, endpoint, started_at, last_seen, status)
VALUES ($1, $2, $3, $4, $5, $6, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'active')
ON CONFLICT (scope, instance) DO UPDATE SET
    node_id = excluded.node_id, host = excluded.host, pid = excluded.pid, endpoint = excluded.endpoint,
    last_seen = excluded.last_seen, status = 'active';

-- name: node_seen
-- args: scope, instance.
UPDATE {{prefix}}nodes SET last_seen = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, status = 'active'
WHERE scope = $1 AND instance = $2;

-- name: node_leave
-- args: scope, instance.
UPDATE {{prefix}}nodes SET last_seen = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, status = 'left'
WHERE scope = $1 AND instance = $2;

-- name: members
-- args: scope. Returns node id, instance, host, pid, endpoint, started at,
-- last seen, status, leads (the lease row names it, unexpired), now. The
-- lease row decides who leads: at most one member does.
SELECT n.node_id, n.instance, n.host, n.pid, n.endpoint, n.started_at, n.last_seen, n.status,
       CASE WHEN l.holder = n.node_id AND l.instance = n.instance AND l.expires_at > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint THEN 1 ELSE 0 END,
       floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM {{prefix}}nodes n LEFT JOIN {{prefix}}lease l ON l.name = n.scope
WHERE n.scope = $1
ORDER BY n.node_id, n.started_at;

-- name: tips_list
-- args: none. Every chain tip: scope, lease name, counter, hash, token,
-- updated at.
SELECT scope, lease_name, at_counter, row_hash, fencing_token, updated_at
FROM {{prefix}}chain_tips ORDER BY scope;

-- name: lease_expire
-- args: name. An operator ends the current term at once (clusterctl
-- release -force); the token is kept; the followers are told.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), expired AS (
    UPDATE {{prefix}}lease AS l SET renewed_at = c.now_ms, expires_at = c.now_ms
    FROM clock c
    WHERE l.name = $1 AND l.expires_at > c.now_ms
    RETURNING l.name
)
SELECT pg_notify('{{prefix}}lease', name) FROM expired;

-- name: lease_retire
-- args: name. An operator retires a lease name: the row stays, with its
-- token (a name used again continues from it), but names no holder.
UPDATE {{prefix}}lease SET holder = '', instance = '', endpoint = ''
WHERE name = $1 AND expires_at <= floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;

-- name: nodes_retire
-- args: scope. The members of a retired lease name have left.
UPDATE {{prefix}}nodes SET status = 'left' WHERE scope = $1;

-- name: store_identity
-- args: none. Names the database, so nodes in one process that reach it
-- through different pools wake each other on a release.
SELECT current_database() || '@' || COALESCE(host(inet_server_addr()), 'local') || ':' || COALESCE(inet_server_port(), 0)::text;
