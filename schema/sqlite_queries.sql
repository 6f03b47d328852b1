-- Queries of the default provider on SQLite. Each starts at a "-- name:"
-- line; the same name does the same thing in every dialect. SQLite's 'now'
-- is one instant for the whole statement.

-- name: acquire
-- ?1 name, ?2 holder, ?3 instance, ?4 ttl ms, ?5 endpoint.
-- Grants a new term if the lease is free or expired; returns no row if not.
INSERT INTO {{prefix}}lease
    (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint)
SELECT ?1, ?2, ?3,
       COALESCE((SELECT value FROM {{prefix}}high_water WHERE scope = 'lease/' || ?1), 0) + 1,
       now_ms, now_ms, now_ms + ?4, ?5
FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now_ms) WHERE true
ON CONFLICT (name) DO UPDATE SET
    holder        = excluded.holder,
    instance      = excluded.instance,
    fencing_token = fencing_token + 1,
    acquired_at   = excluded.acquired_at,
    renewed_at    = excluded.renewed_at,
    expires_at    = excluded.expires_at,
    endpoint      = excluded.endpoint
WHERE expires_at <= excluded.acquired_at
RETURNING true, holder, instance, fencing_token, expires_at, endpoint, acquired_at;

-- name: renew
-- ?1 name, ?2 holder, ?3 instance, ?4 fencing token, ?5 ttl ms.
UPDATE {{prefix}}lease
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?5
WHERE name = ?1 AND holder = ?2 AND instance = ?3 AND fencing_token = ?4
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER)
RETURNING expires_at;

-- name: release
-- ?1 name, ?2 holder, ?3 instance, ?4 fencing token (0: any term of the instance).
UPDATE {{prefix}}lease
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE name = ?1 AND holder = ?2 AND instance = ?3
  AND (?4 = 0 OR fencing_token = ?4)
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: leader
-- ?1 name.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM {{prefix}}lease WHERE name = ?1;

-- name: fence
-- ?1 name, ?2 timeout ms (unused: busy_timeout bounds SQLite's waits). SQLite
-- transactions are serializable: a later acquisition cannot commit between
-- this read and the caller's commit.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM {{prefix}}lease WHERE name = ?1 AND ?2 IS NOT NULL;

-- name: tip_read
-- ?1 scope.
SELECT at_counter, row_hash, fencing_token FROM {{prefix}}chain_tips WHERE scope = ?1;

-- name: mark_read
-- ?1 scope ('lease/<name>' or 'chain/<name>'). The high-water mark.
SELECT value FROM {{prefix}}high_water WHERE scope = ?1;

-- name: version_read
SELECT MAX(version) FROM {{prefix}}schema_version;

-- name: version_write
-- ?1 version.
INSERT INTO {{prefix}}schema_version (version, applied_at)
VALUES (?1, CAST(unixepoch('subsec') * 1000 AS INTEGER))
ON CONFLICT (version) DO NOTHING;

-- name: tip_write
-- ?1 scope, ?2 lease name, ?3 counter, ?4 row hash, ?5 fencing token.
-- The guard triggers refuse a stale token or a counter moving backwards.
INSERT INTO {{prefix}}chain_tips (scope, lease_name, at_counter, row_hash, fencing_token, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, CAST(unixepoch('subsec') * 1000 AS INTEGER))
ON CONFLICT (scope) DO UPDATE SET
    lease_name    = excluded.lease_name,
    at_counter    = excluded.at_counter,
    row_hash      = excluded.row_hash,
    fencing_token = excluded.fencing_token,
    updated_at    = excluded.updated_at;

-- name: state_insert
-- ?1 scope, ?2 vault key fingerprint, ?3 node.
INSERT INTO {{prefix}}state (scope, vault_key_fp, rotation_epoch, recorded_at, recorded_by_node)
VALUES (?1, ?2, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER), ?3)
ON CONFLICT (scope) DO NOTHING;

-- name: state_read
-- ?1 scope.
SELECT vault_key_fp, rotation_epoch, recorded_at, recorded_by_node FROM {{prefix}}state WHERE scope = ?1;

-- name: state_rotate
-- ?1 new fingerprint, ?2 node, ?3 scope, ?4 old fingerprint (compare-and-set).
UPDATE {{prefix}}state
SET vault_key_fp = ?1, rotation_epoch = rotation_epoch + 1,
    recorded_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), recorded_by_node = ?2
WHERE scope = ?3 AND vault_key_fp = ?4;
