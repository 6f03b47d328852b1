-- Queries of the default provider on MySQL and MariaDB. Each starts at a
-- "-- name:" line and is loaded into a field of the dialect's queries
-- struct (dialect.go); a name missing here, or one no field takes, fails at
-- load. A name does the same thing in every dialect and takes its
-- arguments in the same order, given on its "-- args:" line (the order is
-- MySQL's, whose placeholders cannot be numbered).
-- MySQL has no UPDATE ... RETURNING: acquire and renew report through the
-- affected-row count and LAST_INSERT_ID(expr). UTC_TIMESTAMP(6) is one
-- instant per statement and does not depend on the session time zone.

-- name: insert_row
-- args: name. Creates a free lease row if there is none.
INSERT INTO {{prefix}}lease
    (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint)
VALUES (?, '', '', 0, 0, 0, 0, '')
ON DUPLICATE KEY UPDATE name = name;

-- name: acquire
-- args: holder, instance, ttl ms, endpoint, name.
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
-- args: ttl ms, name, holder, instance, token.
-- renewed_at always grows, so a matched row always counts as changed;
-- LAST_INSERT_ID(expr) keeps the new expiry for last_insert_id to read.
-- Not a term a release ended (expires_at = renewed_at): MySQL reads the
-- clock when the statement starts, so a renew that waited for the lock of
-- that release would find the term unexpired by its earlier clock.
UPDATE {{prefix}}lease
SET renewed_at = GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, renewed_at + 1),
    expires_at = LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 + ?)
WHERE name = ? AND holder = ? AND instance = ? AND fencing_token = ?
  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
  AND expires_at > renewed_at;

-- name: last_insert_id
-- args: none. The value of the session's last LAST_INSERT_ID(expr).
SELECT LAST_INSERT_ID();

-- name: release
-- args: name, holder, instance, token.
UPDATE {{prefix}}lease
SET renewed_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
WHERE name = ? AND holder = ? AND instance = ? AND fencing_token = ?
  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: release_instance
-- args: name, holder, instance. Releases whatever term the instance holds.
UPDATE {{prefix}}lease
SET renewed_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
WHERE name = ? AND holder = ? AND instance = ?
  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: leader
-- args: name. Returns holder, instance, token, expires, endpoint, now.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM {{prefix}}lease WHERE name = ?;

-- name: acquire_read
-- args: name. What leader returns, for an acquisition's reads, with now
-- no earlier than the row's last renewal: a read can see a term granted
-- after its own statement's clock was taken (the clock is fixed when the
-- statement starts, the rows when it first reads), and that term would
-- then seem to have more than its TTL left.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, renewed_at)
FROM {{prefix}}lease WHERE name = ?;

-- name: fence
-- args: name, timeout ms (applied by the bound_* prefix and idle_timeout,
-- not here). Returns what leader returns. LOCK IN SHARE MODE holds the row
-- until the caller's transaction ends, so no later term can be granted
-- before its writes commit.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM {{prefix}}lease WHERE name = ? AND ? IS NOT NULL LOCK IN SHARE MODE;

-- name: fence_mariadb
-- args: name; {{seconds}}, whole seconds, is formatted in from a duration
-- (never from input). MariaDB's fence: the same read, taken only when the
-- session already ends a transaction idle {{seconds}} or less (see
-- idle_timeout). The condition holds no column, so the server decides it
-- before it reads the table: on a session without the limit the statement
-- returns no row and locks nothing ("Impossible WHERE"), and fence sets the
-- limit and reads again. A connection that fenced before keeps the limit,
-- so a fence on it is this one statement.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM {{prefix}}lease
WHERE name = ? AND @@session.idle_transaction_timeout BETWEEN 1 AND {{seconds}}
  AND @@session.idle_write_transaction_timeout BETWEEN 0 AND {{seconds}}
  AND @@session.idle_readonly_transaction_timeout BETWEEN 0 AND {{seconds}}
LOCK IN SHARE MODE;

-- name: lease_token
-- args: name.
SELECT fencing_token FROM {{prefix}}lease WHERE name = ?;

-- name: tip_read
-- args: scope. Returns counter, hash, token, lease name.
SELECT at_counter, row_hash, fencing_token, lease_name FROM {{prefix}}chain_tips WHERE scope = ?;

-- name: mark_read
-- args: scope ('lease/<name>' or 'chain/<name>'). The high-water mark.
SELECT value FROM {{prefix}}high_water WHERE scope = ?;

-- name: chain_top
-- args: none. {{table}} and {{counter}} are a chain's validated names.
SELECT MAX({{counter}}) FROM {{table}};

-- name: chain_hash_at
-- args: counter. {{table}}, {{counter}} and {{hash}} are validated names.
SELECT {{hash}} FROM {{table}} WHERE {{counter}} = ?;

-- name: version_read
-- args: none.
SELECT MAX(version) FROM {{prefix}}schema_version;

-- name: version_write
-- args: version.
INSERT IGNORE INTO {{prefix}}schema_version (version, applied_at)
VALUES (?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000);

-- name: tip_write
-- args: scope, lease name, counter, hash, token.
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
-- args: scope, fingerprint, node.
INSERT INTO {{prefix}}state (scope, vault_key_fp, rotation_epoch, recorded_at, recorded_by_node)
VALUES (?, ?, 0, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, ?)
ON DUPLICATE KEY UPDATE scope = scope;

-- name: state_read
-- args: scope. Returns fingerprint, epoch, recorded at, recorded by.
SELECT vault_key_fp, rotation_epoch, recorded_at, recorded_by_node FROM {{prefix}}state WHERE scope = ?;

-- name: state_rotate
-- args: new fingerprint, node, scope, old fingerprint (compare-and-set).
UPDATE {{prefix}}state
SET vault_key_fp = ?, rotation_epoch = rotation_epoch + 1,
    recorded_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, recorded_by_node = ?
WHERE scope = ? AND vault_key_fp = ?;

-- name: server_version
-- args: none.
SELECT VERSION();

-- name: temp_probe
-- args: none. Succeeds when this role may create temporary tables.
CREATE TEMPORARY TABLE {{prefix}}temp_probe (x INT);

-- name: temp_drop
-- args: none.
DROP TEMPORARY TABLE IF EXISTS {{prefix}}temp_probe;

-- name: schema_lock
-- args: lock name. Waits up to 60s; returns 1 when taken. MySQL DDL
-- commits implicitly, so a named lock serializes the nodes.
SELECT GET_LOCK(?, 60);

-- name: schema_unlock
-- args: lock name.
SELECT RELEASE_LOCK(?);

-- name: lock_wait_save
-- args: seconds. Bounds each DDL statement's wait for a metadata lock,
-- keeping the connection's own value to put back.
SET @sqlfence_lock_wait_timeout = @@SESSION.lock_wait_timeout, SESSION lock_wait_timeout = ?;

-- name: lock_wait_restore
-- args: none.
SET SESSION lock_wait_timeout = @sqlfence_lock_wait_timeout;

-- name: idle_timeout
-- args: none; {{seconds}}, whole seconds, is formatted in from a duration
-- (never from input). MariaDB: the server ends a transaction idle this
-- long; a shorter setting the application chose is kept. Sent before the
-- lease row is locked: the server picks the idle limit each time it waits
-- for the client's next statement, so a limit set after the lock would
-- leave the wait for that statement unbounded (wait_timeout, 8 hours by
-- default). Without arguments go-sql-driver/mysql sends it as text, one
-- round trip, where a statement with arguments is prepared and run, two.
-- MariaDB ends a transaction that wrote after idle_write_transaction_timeout
-- and a read-only one after idle_readonly_transaction_timeout, when those
-- are set (not 0), whatever idle_transaction_timeout says: a nonzero one
-- longer than {{seconds}} is shortened too.
SET SESSION idle_transaction_timeout =
    IF(@@session.idle_transaction_timeout BETWEEN 1 AND {{seconds}}, @@session.idle_transaction_timeout, {{seconds}}),
    idle_write_transaction_timeout =
    IF(@@session.idle_write_transaction_timeout BETWEEN 0 AND {{seconds}}, @@session.idle_write_transaction_timeout, {{seconds}}),
    idle_readonly_transaction_timeout =
    IF(@@session.idle_readonly_transaction_timeout BETWEEN 0 AND {{seconds}}, @@session.idle_readonly_transaction_timeout, {{seconds}});

-- name: bound_mariadb
-- A lease statement with a server-side limit: {{seconds}} (fractional) for
-- the whole statement, {{lock_wait}} whole seconds for its lock wait.
SET STATEMENT max_statement_time={{seconds}}, innodb_lock_wait_timeout={{lock_wait}} FOR {{statement}};

-- name: bound_mysql
-- MySQL 8 takes the bounds as optimizer hints after the statement's first
-- word ({{verb}}); MAX_EXECUTION_TIME applies to SELECT only.
{{verb}} /*+ SET_VAR(innodb_lock_wait_timeout={{lock_wait}}) MAX_EXECUTION_TIME({{ms}}) */ {{rest}};

-- name: node_recycle
-- args: instance, node id, host, pid, endpoint, timeout ms, scope,
-- retention ms, crashed retention ms (this order on every dialect, MySQL's placeholders
-- being positional). A joining node takes over the row of a member of the
-- scope that left (Shutdown) longer than the retention ago, or that was
-- last seen longer than the crashed retention ago while still marked
-- active (its process died without Shutdown), the oldest first, rather
-- than adding one, so restarts do not grow the table, with no DELETE
-- right. The crashed retention is days: a process paused that long finds
-- its row gone (node_seen updates no row) and joins again. No row
-- updated: node_join adds one.
UPDATE {{prefix}}nodes
SET instance = ?, node_id = ?, host = ?, pid = ?, endpoint = ?, timeout_ms = ?,
    started_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    last_seen = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    status = 'active', takes_lanes = 0
WHERE scope = ?
  AND (status = 'left' AND last_seen < TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - ?
    OR status = 'active' AND last_seen < TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - ?)
ORDER BY last_seen, instance LIMIT 1;

-- name: node_join
-- args: scope, instance, node id, host, pid, endpoint, timeout ms.
INSERT INTO {{prefix}}nodes (scope, instance, node_id, host, pid, endpoint, timeout_ms, started_at, last_seen, status)
VALUES (?, ?, ?, ?, ?, ?, ?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, 'active')
ON DUPLICATE KEY UPDATE
    node_id = VALUES(node_id), host = VALUES(host), pid = VALUES(pid), endpoint = VALUES(endpoint),
    timeout_ms = VALUES(timeout_ms), last_seen = VALUES(last_seen), status = 'active';

-- name: node_seen
-- args: scope, instance.
UPDATE {{prefix}}nodes SET last_seen = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, status = 'active'
WHERE scope = ? AND instance = ?;

-- name: node_row
-- args: scope, instance. One row when the instance has a membership row
-- (Seen asks when node_seen reports no row updated: MySQL counts the rows
-- an UPDATE changed, and one in the same millisecond as the last changes
-- none).
SELECT 1 FROM {{prefix}}nodes WHERE scope = ? AND instance = ?;

-- name: node_leave
-- args: scope, instance.
UPDATE {{prefix}}nodes SET last_seen = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, status = 'left'
WHERE scope = ? AND instance = ?;

-- name: members
-- args: scope. Returns node id, instance, host, pid, endpoint, started at,
-- last seen, status, timeout ms, leads (the lease row names it,
-- unexpired), now. The lease row decides who leads: at most one member
-- does.
SELECT n.node_id, n.instance, n.host, n.pid, n.endpoint, n.started_at, n.last_seen, n.status, n.timeout_ms,
       CASE WHEN l.holder = n.node_id AND l.instance = n.instance AND l.expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 THEN 1 ELSE 0 END,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM {{prefix}}nodes n LEFT JOIN {{prefix}}lease l ON l.name = n.scope
WHERE n.scope = ?
ORDER BY n.node_id, n.started_at;

-- name: tips_list
-- args: none. Every chain tip: scope, lease name, counter, hash, token,
-- updated at.
SELECT scope, lease_name, at_counter, row_hash, fencing_token, updated_at
FROM {{prefix}}chain_tips ORDER BY scope;

-- name: lease_expire
-- args: name, token. An operator ends the term of that token at once
-- (clusterctl release -force), and no other; the token is kept.
UPDATE {{prefix}}lease SET renewed_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
WHERE name = ? AND fencing_token = ? AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: lease_retire
-- args: name. An operator retires a lease name: the row stays, with its
-- token (a name used again continues from it), but names no holder.
UPDATE {{prefix}}lease SET holder = '', instance = '', endpoint = ''
WHERE name = ? AND expires_at <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: nodes_retire
-- args: scope. The members of a retired lease name have left.
UPDATE {{prefix}}nodes SET status = 'left' WHERE scope = ?;

-- name: lane_peek
-- args: scope, window ms, scope, instance, scope, instance, window ms,
-- instance, scope, node id, window ms, instance, scope, instance, window
-- ms, scope, lane. Reads a lane without locking it, and what its fair
-- share is computed from: holder, instance, token, acquired, renewed,
-- expires (NULL when the lane has no row), the lanes of scope held within
-- the window, the instance's unexpired lanes, the other live members that
-- take lanes, the live members with the same node id that started before
-- the instance
-- (a duplicate NodeID), the loads (below), now. The loads list, for each
-- other live member that takes lanes, its unexpired lanes and whether its
-- node id (then instance) sorts before the instance's ('b') or not ('a'):
-- '2b,1a'; NULL when there is none. When the lanes do not divide evenly,
-- the members that sort first hold one more.
SELECT l.holder, l.instance, l.fencing_token, l.acquired_at, l.renewed_at, l.expires_at,
       (SELECT COUNT(*) FROM {{prefix}}lanes WHERE scope = ?
            AND renewed_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - ?),
       (SELECT COUNT(*) FROM {{prefix}}lanes WHERE scope = ? AND instance = ?
            AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000),
       (SELECT COUNT(*) FROM {{prefix}}nodes WHERE scope = ? AND instance <> ? AND status = 'active' AND takes_lanes = 1
            AND last_seen > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - ?),
       (SELECT COUNT(*) FROM {{prefix}}nodes o JOIN {{prefix}}nodes me ON me.scope = o.scope AND me.instance = ?
            WHERE o.scope = ? AND o.node_id = ? AND o.instance <> me.instance AND o.status = 'active'
              AND o.last_seen > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - ?
              AND (o.started_at < me.started_at OR (o.started_at = me.started_at AND o.instance < me.instance))),
       (SELECT GROUP_CONCAT(CONCAT(x.n, x.b) SEPARATOR ',') FROM (
            SELECT (SELECT count(*) FROM {{prefix}}lanes h WHERE h.scope = o.scope AND h.instance = o.instance
                        AND h.expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AS n,
                   CASE WHEN o.node_id < me.node_id OR (o.node_id = me.node_id AND o.instance < me.instance) THEN 'b' ELSE 'a' END AS b
            FROM {{prefix}}nodes o JOIN {{prefix}}nodes me ON me.scope = o.scope AND me.instance = ?
            WHERE o.scope = ? AND o.instance <> ? AND o.status = 'active' AND o.takes_lanes = 1
              AND o.last_seen > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - ?) x),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM (SELECT 1 AS one) AS c LEFT JOIN {{prefix}}lanes l ON l.scope = ? AND l.lane = ?;

-- name: lane_claim
-- args: holder, instance, ttl ms, scope, lane, instance, timeout ms (applied
-- by the bound_* prefix and idle_timeout, not here). Claims a lane that is
-- free or expired (a new token) or renews the instance's own (the same
-- token), in the caller's transaction, whose row lock holds the claim until
-- it ends. MySQL assigns left to right, so the token and acquired_at are
-- set while expires_at still has its old value; renewed_at always grows, so
-- a claimed row always counts as changed. A renewal skips a claim a
-- release or an operator ended (expires_at = renewed_at): MySQL reads the
-- clock when the statement starts, before any wait for the row.
UPDATE {{prefix}}lanes
SET fencing_token = IF(expires_at <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, fencing_token + 1, fencing_token),
    acquired_at   = IF(expires_at <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
                       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, acquired_at),
    holder        = ?,
    instance      = ?,
    renewed_at    = GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, renewed_at + 1),
    expires_at    = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 + ?
WHERE scope = ? AND lane = ?
  AND ((instance = ? AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AND expires_at > renewed_at)
       OR expires_at <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)
  AND ? IS NOT NULL;

-- name: lane_read
-- args: scope, lane. Returns holder, instance, token, acquired, renewed,
-- expires, now.
SELECT holder, instance, fencing_token, acquired_at, renewed_at, expires_at,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM {{prefix}}lanes WHERE scope = ? AND lane = ?;

-- name: lane_create
-- args: scope, lane. A free lane row with token 0, if there is none.
INSERT INTO {{prefix}}lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at)
VALUES (?, ?, '', '', 0, 0, 0, 0)
ON DUPLICATE KEY UPDATE scope = scope;

-- name: lane_renew
-- args: ttl ms, scope, instance. Renews every unexpired lane of the
-- instance, in one statement. Not a lane a release or an operator ended
-- (expires_at = renewed_at): MySQL reads the clock when the statement
-- starts, so a renew that waited for the lock of a release that ended the
-- claim would find it unexpired by that earlier clock.
UPDATE {{prefix}}lanes
SET renewed_at = GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000, renewed_at + 1),
    expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 + ?
WHERE scope = ? AND instance = ?
  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
  AND expires_at > renewed_at;

-- name: lane_report
-- args: scope, window ms, scope, instance, window ms, instance, scope,
-- instance, window ms, scope, scope, instance. One row per unexpired lane
-- of the instance (one row with NULL lane columns when it has none): the
-- lanes of scope held within the window, the other live members that take
-- lanes, their loads (as in lane_peek), the config version (NULL when none), now, lane,
-- token, acquired, expires.
SELECT (SELECT COUNT(*) FROM {{prefix}}lanes WHERE scope = ?
            AND renewed_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - ?),
       (SELECT COUNT(*) FROM {{prefix}}nodes WHERE scope = ? AND instance <> ? AND status = 'active' AND takes_lanes = 1
            AND last_seen > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - ?),
       (SELECT GROUP_CONCAT(CONCAT(x.n, x.b) SEPARATOR ',') FROM (
            SELECT (SELECT count(*) FROM {{prefix}}lanes h WHERE h.scope = o.scope AND h.instance = o.instance
                        AND h.expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AS n,
                   CASE WHEN o.node_id < me.node_id OR (o.node_id = me.node_id AND o.instance < me.instance) THEN 'b' ELSE 'a' END AS b
            FROM {{prefix}}nodes o JOIN {{prefix}}nodes me ON me.scope = o.scope AND me.instance = ?
            WHERE o.scope = ? AND o.instance <> ? AND o.status = 'active' AND o.takes_lanes = 1
              AND o.last_seen > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - ?) x),
       (SELECT config_version FROM {{prefix}}config WHERE scope = ?),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
       l.lane, l.fencing_token, l.acquired_at, l.expires_at
FROM (SELECT 1 AS one) AS c LEFT JOIN {{prefix}}lanes l ON l.scope = ? AND l.instance = ?
    AND l.expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: lane_list
-- args: scope. Every lane of scope, by key: lane, holder, instance, token,
-- acquired, renewed, expires, now. For operators (clusterctl lanes).
SELECT lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM {{prefix}}lanes WHERE scope = ? ORDER BY lane;

-- name: lane_expire
-- args: scope, lane, token. An operator ends the claim of a lane under
-- that token at once, whoever holds it (clusterctl release -lane), and no
-- other; the token is kept.
UPDATE {{prefix}}lanes
SET renewed_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
WHERE scope = ? AND lane = ? AND fencing_token = ?
  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: lane_release
-- args: scope, lane, holder, instance. Ends the instance's claim at once,
-- keeping the token; renewed_at records when, for the fair share's window.
UPDATE {{prefix}}lanes
SET renewed_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
WHERE scope = ? AND lane = ? AND holder = ? AND instance = ?
  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: lane_release_all
-- args: scope, holder, instance. Ends every claim of the instance at once.
UPDATE {{prefix}}lanes
SET renewed_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000,
    expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
WHERE scope = ? AND holder = ? AND instance = ?
  AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: lane_join
-- args: scope, instance. The member takes lanes: it counts towards their
-- fair share while it is live.
UPDATE {{prefix}}nodes SET takes_lanes = 1 WHERE scope = ? AND instance = ?;

-- name: config_read
-- args: scope.
SELECT config_version FROM {{prefix}}config WHERE scope = ?;

-- name: config_create
-- args: scope. The version row at 0, if there is none.
INSERT INTO {{prefix}}config (scope, config_version, updated_at)
VALUES (?, 0, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)
ON DUPLICATE KEY UPDATE scope = scope;

-- name: config_bump
-- args: scope. Increments the version atomically (creating it at 1);
-- LAST_INSERT_ID(expr) keeps it for last_insert_id to read.
INSERT INTO {{prefix}}config (scope, config_version, updated_at)
VALUES (?, LAST_INSERT_ID(1), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)
ON DUPLICATE KEY UPDATE
    config_version = LAST_INSERT_ID(config_version + 1),
    updated_at     = VALUES(updated_at);

-- name: node_live
-- args: scope, node id, timeout ms. Counts the live rows of a node id: active
-- and seen within the row's own timeout (the given one for a row without),
-- by the database clock.
SELECT count(*) FROM {{prefix}}nodes
WHERE scope = ? AND node_id = ? AND status = 'active'
  AND last_seen > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - CASE WHEN timeout_ms > 0 THEN timeout_ms ELSE ? END;

-- name: node_forget
-- args: scope, node id, timeout ms. Deletes the rows of a node id that are
-- not live (as node_live judges). A live row stays, however the call raced
-- with it.
DELETE FROM {{prefix}}nodes
WHERE scope = ? AND node_id = ?
  AND (status <> 'active' OR last_seen <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 - CASE WHEN timeout_ms > 0 THEN timeout_ms ELSE ? END);
