-- Queries of the default provider on MySQL and MariaDB. Each starts at a
-- "-- name:" line; the same name does the same thing in every dialect.
-- MySQL has no UPDATE ... RETURNING: acquire and renew report through the
-- affected-row count and LAST_INSERT_ID(expr). UTC_TIMESTAMP(6) is one
-- instant per statement and does not depend on the session time zone.

-- name: insert_row
-- ? name. Creates a free lease row if there is none.
INSERT INTO {{prefix}}lease
    (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint)
VALUES (?, '', '', 0, 0, 0, 0, '')
ON DUPLICATE KEY UPDATE name = name;

-- name: acquire
-- holder, instance, ttl ms, endpoint, name.
-- Grants a new term if the lease is free or expired. One statement, so no
-- lock outlives it even if the client vanishes. LAST_INSERT_ID(expr) keeps
-- the new token in the session for last_insert_id to read (the OK packet's
-- copy is not reliable when the table has triggers).
UPDATE {{prefix}}lease
SET holder        = ?,
    instance      = ?,
    fencing_token = LAST_INSERT_ID(fencing_token + 1),
    acquired_at   = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    renewed_at    = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    expires_at    = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 + ?,
    endpoint      = ?
WHERE name = ? AND expires_at <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: renew
-- ttl ms, name, holder, instance, fencing token.
-- renewed_at always grows, so a matched row always counts as changed;
-- LAST_INSERT_ID(expr) keeps the new expiry for last_insert_id to read.
UPDATE {{prefix}}lease
SET renewed_at = GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, renewed_at + 1),
    expires_at = LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 + ?)
WHERE name = ? AND holder = ? AND instance = ? AND fencing_token = ?
  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: last_insert_id
-- The value of the session's last LAST_INSERT_ID(expr).
SELECT LAST_INSERT_ID();

-- name: release
-- name, holder, instance, fencing token, fencing token (0: any term of the instance).
UPDATE {{prefix}}lease
SET renewed_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
WHERE name = ? AND holder = ? AND instance = ? AND (? = 0 OR fencing_token = ?)
  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: leader
-- ? name.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM {{prefix}}lease WHERE name = ?;

-- name: fence
-- ? name, ? timeout ms (bound in Go by a statement prefix). LOCK IN SHARE
-- MODE holds the row until the caller's transaction ends, so no later term
-- can be granted before its writes commit.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM {{prefix}}lease WHERE name = ? AND ? IS NOT NULL LOCK IN SHARE MODE;

-- name: tip_read
-- ? scope.
SELECT at_counter, row_hash, fencing_token FROM {{prefix}}chain_tips WHERE scope = ?;

-- name: mark_read
-- ? scope ('lease/<name>' or 'chain/<name>'). The high-water mark.
SELECT value FROM {{prefix}}high_water WHERE scope = ?;

-- name: version_read
SELECT MAX(version) FROM {{prefix}}schema_version;

-- name: version_write
-- ? version.
INSERT IGNORE INTO {{prefix}}schema_version (version, applied_at)
VALUES (?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000);

-- name: tip_write
-- scope, lease name, counter, row hash, fencing token.
-- The guard triggers refuse a stale token or a counter moving backwards.
INSERT INTO {{prefix}}chain_tips (scope, lease_name, at_counter, row_hash, fencing_token, updated_at)
VALUES (?, ?, ?, ?, ?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)
ON DUPLICATE KEY UPDATE
    lease_name    = VALUES(lease_name),
    at_counter    = VALUES(at_counter),
    row_hash      = VALUES(row_hash),
    fencing_token = VALUES(fencing_token),
    updated_at    = VALUES(updated_at);

-- name: state_insert
-- scope, vault key fingerprint, node.
INSERT INTO {{prefix}}state (scope, vault_key_fp, rotation_epoch, recorded_at, recorded_by_node)
VALUES (?, ?, 0, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, ?)
ON DUPLICATE KEY UPDATE scope = scope;

-- name: state_read
-- ? scope.
SELECT vault_key_fp, rotation_epoch, recorded_at, recorded_by_node FROM {{prefix}}state WHERE scope = ?;

-- name: state_rotate
-- scope, new fingerprint, node, old fingerprint (compare-and-set).
UPDATE {{prefix}}state
SET vault_key_fp = ?, rotation_epoch = rotation_epoch + 1,
    recorded_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, recorded_by_node = ?
WHERE scope = ? AND vault_key_fp = ?;
