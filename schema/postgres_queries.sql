-- Queries of the default provider on PostgreSQL. Each starts at a
-- "-- name:" line; the same name does the same thing in every dialect.
-- The clock CTE reads clock_timestamp() once, so one statement sees one
-- instant (now() would be the start of the transaction).

-- name: acquire
-- $1 name, $2 holder, $3 instance, $4 ttl ms, $5 endpoint.
-- Grants a new term if the lease is free or expired, else reports the holder.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), granted AS (
    INSERT INTO {{prefix}}lease AS l
        (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint)
    SELECT $1, $2, $3,
           COALESCE((SELECT value FROM {{prefix}}high_water WHERE scope = 'lease/' || $1), 0) + 1,
           now_ms, now_ms, now_ms + $4::bigint, $5
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
WHERE l.name = $1 AND NOT EXISTS (SELECT 1 FROM granted);

-- name: renew
-- $1 name, $2 holder, $3 instance, $4 fencing token, $5 ttl ms.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
UPDATE {{prefix}}lease AS l
SET renewed_at = c.now_ms, expires_at = c.now_ms + $5::bigint
FROM clock c
WHERE l.name = $1 AND l.holder = $2 AND l.instance = $3 AND l.fencing_token = $4
  AND l.expires_at > c.now_ms
RETURNING l.expires_at;

-- name: release
-- $1 name, $2 holder, $3 instance, $4 fencing token (0: any term of the instance).
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
UPDATE {{prefix}}lease AS l
SET renewed_at = c.now_ms, expires_at = c.now_ms
FROM clock c
WHERE l.name = $1 AND l.holder = $2 AND l.instance = $3
  AND ($4::bigint = 0 OR l.fencing_token = $4::bigint)
  AND l.expires_at > c.now_ms;

-- name: leader
-- $1 name.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM {{prefix}}lease WHERE name = $1;

-- name: fence
-- $1 name, $2 timeout ms. FOR SHARE holds the row until the caller's
-- transaction ends, so no later term can be granted before its writes
-- commit. The set_config calls run before the row lock is taken and last
-- until the transaction ends: the wait for the lock, and any idle moment of
-- the transaction (its client vanished), are bounded by $2.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM {{prefix}}lease
WHERE name = $1
  AND set_config('lock_timeout', $2::text, true) IS NOT NULL
  AND set_config('idle_in_transaction_session_timeout', $2::text, true) IS NOT NULL
FOR SHARE;

-- name: tip_read
-- $1 scope.
SELECT at_counter, row_hash, fencing_token FROM {{prefix}}chain_tips WHERE scope = $1;

-- name: mark_read
-- $1 scope ('lease/<name>' or 'chain/<name>'). The high-water mark.
SELECT value FROM {{prefix}}high_water WHERE scope = $1;

-- name: version_read
SELECT MAX(version) FROM {{prefix}}schema_version;

-- name: version_write
-- $1 version.
INSERT INTO {{prefix}}schema_version (version, applied_at)
VALUES ($1, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (version) DO NOTHING;

-- name: tip_write
-- $1 scope, $2 lease name, $3 counter, $4 row hash, $5 fencing token.
-- The guard trigger refuses a stale token or a counter moving backwards.
INSERT INTO {{prefix}}chain_tips (scope, lease_name, at_counter, row_hash, fencing_token, updated_at)
VALUES ($1, $2, $3, $4, $5, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (scope) DO UPDATE SET
    lease_name    = excluded.lease_name,
    at_counter    = excluded.at_counter,
    row_hash      = excluded.row_hash,
    fencing_token = excluded.fencing_token,
    updated_at    = excluded.updated_at;

-- name: state_insert
-- $1 scope, $2 vault key fingerprint, $3 node.
INSERT INTO {{prefix}}state (scope, vault_key_fp, rotation_epoch, recorded_at, recorded_by_node)
VALUES ($1, $2, 0, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, $3)
ON CONFLICT (scope) DO NOTHING;

-- name: state_read
-- $1 scope.
SELECT vault_key_fp, rotation_epoch, recorded_at, recorded_by_node FROM {{prefix}}state WHERE scope = $1;

-- name: state_rotate
-- $1 new fingerprint, $2 node, $3 scope, $4 old fingerprint (compare-and-set).
UPDATE {{prefix}}state
SET vault_key_fp = $1, rotation_epoch = rotation_epoch + 1,
    recorded_at = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, recorded_by_node = $2
WHERE scope = $3 AND vault_key_fp = $4;
