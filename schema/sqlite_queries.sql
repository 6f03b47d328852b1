-- Queries of the default provider on SQLite. Each starts at a "-- name:"
-- line and is loaded into a field of the dialect's queries struct
-- (dialect.go); a name missing here, or one no field takes, fails at load.
-- A name does the same thing in every dialect and takes its arguments in
-- the same order, given on its "-- args:" line. SQLite's 'now' is one
-- instant for the whole statement.

-- name: acquire
-- args: holder, instance, ttl ms, endpoint, name.
-- Grants a new term if the lease is free or expired; returns no row if not.
INSERT INTO {{prefix}}lease
    (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint)
SELECT ?5, ?1, ?2,
       COALESCE((SELECT value FROM {{prefix}}high_water WHERE scope = 'lease/' || ?5), 0) + 1,
       now_ms, now_ms, now_ms + ?3, ?4
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
-- args: ttl ms, name, holder, instance, token. Returns the new expiry. Not
-- a term a release ended (expires_at = renewed_at), as on the other
-- dialects.
UPDATE {{prefix}}lease
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?1
WHERE name = ?2 AND holder = ?3 AND instance = ?4 AND fencing_token = ?5
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER) AND expires_at > renewed_at
RETURNING expires_at;

-- name: release
-- args: name, holder, instance, token.
UPDATE {{prefix}}lease
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE name = ?1 AND holder = ?2 AND instance = ?3 AND fencing_token = ?4
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: release_instance
-- args: name, holder, instance. Releases whatever term the instance holds.
UPDATE {{prefix}}lease
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE name = ?1 AND holder = ?2 AND instance = ?3
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: leader
-- args: name. Returns holder, instance, token, expires, endpoint, now.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM {{prefix}}lease WHERE name = ?1;

-- name: lease_token
-- args: name.
SELECT fencing_token FROM {{prefix}}lease WHERE name = ?1;

-- name: fence
-- args: name, timeout ms (unused: busy_timeout bounds SQLite's waits).
-- Returns what leader returns. SQLite transactions are serializable: a
-- later acquisition cannot commit between this read and the caller's
-- commit.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM {{prefix}}lease WHERE name = ?1 AND ?2 IS NOT NULL;

-- name: tip_read
-- args: scope. Returns counter, hash, token, lease name.
SELECT at_counter, row_hash, fencing_token, lease_name FROM {{prefix}}chain_tips WHERE scope = ?1;

-- name: tip_write
-- args: scope, lease name, counter, hash, token.
-- The guard triggers refuse a stale token or a counter moving backwards.
INSERT INTO {{prefix}}chain_tips (scope, lease_name, at_counter, row_hash, fencing_token, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, CAST(unixepoch('subsec') * 1000 AS INTEGER))
ON CONFLICT (scope) DO UPDATE SET
    lease_name    = excluded.lease_name,
    at_counter    = excluded.at_counter,
    row_hash      = excluded.row_hash,
    fencing_token = excluded.fencing_token,
    updated_at    = excluded.updated_at;

-- name: mark_read
-- args: scope ('lease/<name>' or 'chain/<name>'). The high-water mark.
SELECT value FROM {{prefix}}high_water WHERE scope = ?1;

-- name: chain_top
-- args: none. {{table}} and {{counter}} are a chain's validated names.
SELECT MAX({{counter}}) FROM {{table}};

-- name: chain_hash_at
-- args: counter. {{table}}, {{counter}} and {{hash}} are validated names.
SELECT {{hash}} FROM {{table}} WHERE {{counter}} = ?1;

-- name: version_read
-- args: none.
SELECT MAX(version) FROM {{prefix}}schema_version;

-- name: version_write
-- args: version.
INSERT INTO {{prefix}}schema_version (version, applied_at)
VALUES (?1, CAST(unixepoch('subsec') * 1000 AS INTEGER))
ON CONFLICT (version) DO NOTHING;

-- name: state_insert
-- args: scope, fingerprint, node.
INSERT INTO {{prefix}}state (scope, vault_key_fp, rotation_epoch, recorded_at, recorded_by_node)
VALUES (?1, ?2, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER), ?3)
ON CONFLICT (scope) DO NOTHING;

-- name: state_read
-- args: scope. Returns fingerprint, epoch, recorded at, recorded by.
SELECT vault_key_fp, rotation_epoch, recorded_at, recorded_by_node FROM {{prefix}}state WHERE scope = ?1;

-- name: state_rotate
-- args: new fingerprint, node, scope, old fingerprint (compare-and-set).
UPDATE {{prefix}}state
SET vault_key_fp = ?1, rotation_epoch = rotation_epoch + 1,
    recorded_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), recorded_by_node = ?2
WHERE scope = ?3 AND vault_key_fp = ?4;

-- name: busy_timeout
-- args: none. The connection's busy timeout, ms.
PRAGMA busy_timeout;

-- name: schema_lock
-- args: none. Takes the write lock now; DDL is transactional.
BEGIN IMMEDIATE;

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
SET instance = ?1, node_id = ?2, host = ?3, pid = ?4, endpoint = ?5, timeout_ms = ?6,
    started_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), last_seen = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    status = 'active', takes_lanes = 0
WHERE (scope, instance) = (
    SELECT o.scope, o.instance FROM {{prefix}}nodes o
    WHERE o.scope = ?7
      AND (o.status = 'left' AND o.last_seen < CAST(unixepoch('subsec') * 1000 AS INTEGER) - ?8
        OR o.status = 'active' AND o.last_seen < CAST(unixepoch('subsec') * 1000 AS INTEGER) - ?9)
    ORDER BY o.last_seen, o.instance LIMIT 1);

-- name: node_join
-- args: scope, instance, node id, host, pid, endpoint, timeout ms.
INSERT INTO {{prefix}}nodes (scope, instance, node_id, host, pid, endpoint, timeout_ms, started_at, last_seen, status)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, CAST(unixepoch('subsec') * 1000 AS INTEGER), CAST(unixepoch('subsec') * 1000 AS INTEGER), 'active')
ON CONFLICT (scope, instance) DO UPDATE SET
    node_id = excluded.node_id, host = excluded.host, pid = excluded.pid, endpoint = excluded.endpoint,
    timeout_ms = excluded.timeout_ms, last_seen = excluded.last_seen, status = 'active';

-- name: node_seen
-- args: scope, instance.
UPDATE {{prefix}}nodes SET last_seen = CAST(unixepoch('subsec') * 1000 AS INTEGER), status = 'active'
WHERE scope = ?1 AND instance = ?2;

-- name: node_row
-- args: scope, instance. One row when the instance has a membership row
-- (Seen asks when node_seen reports no row updated).
SELECT 1 FROM {{prefix}}nodes WHERE scope = ?1 AND instance = ?2;

-- name: node_leave
-- args: scope, instance.
UPDATE {{prefix}}nodes SET last_seen = CAST(unixepoch('subsec') * 1000 AS INTEGER), status = 'left'
WHERE scope = ?1 AND instance = ?2;

-- name: members
-- args: scope. Returns node id, instance, host, pid, endpoint, started at,
-- last seen, status, timeout ms, leads (the lease row names it,
-- unexpired), now. The lease row decides who leads: at most one member
-- does.
SELECT n.node_id, n.instance, n.host, n.pid, n.endpoint, n.started_at, n.last_seen, n.status, n.timeout_ms,
       CASE WHEN l.holder = n.node_id AND l.instance = n.instance AND l.expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER) THEN 1 ELSE 0 END,
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM {{prefix}}nodes n LEFT JOIN {{prefix}}lease l ON l.name = n.scope
WHERE n.scope = ?1
ORDER BY n.node_id, n.started_at;

-- name: tips_list
-- args: none. Every chain tip: scope, lease name, counter, hash, token,
-- updated at.
SELECT scope, lease_name, at_counter, row_hash, fencing_token, updated_at
FROM {{prefix}}chain_tips ORDER BY scope;

-- name: lease_expire
-- args: name, token. An operator ends the term of that token at once
-- (clusterctl release -force), and no other; the token is kept.
UPDATE {{prefix}}lease SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE name = ?1 AND fencing_token = ?2 AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: lease_retire
-- args: name. An operator retires a lease name: the row stays, with its
-- token (a name used again continues from it), but names no holder.
UPDATE {{prefix}}lease SET holder = '', instance = '', endpoint = ''
WHERE name = ?1 AND expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: nodes_retire
-- args: scope. The members of a retired lease name have left.
UPDATE {{prefix}}nodes SET status = 'left' WHERE scope = ?1;

-- name: lane_peek
-- args: scope, window ms, scope, instance, scope, instance, window ms,
-- instance, scope, node id, window ms, instance, scope, instance, window
-- ms, scope, lane. Reads a lane, and what its fair share is computed
-- from: holder, instance, token, acquired, renewed, expires (NULL when the
-- lane has no row), the lanes of scope held within the window, the
-- instance's unexpired lanes, the other live members that take lanes, the
-- live members with the same node id that started before the instance
-- (a duplicate NodeID), the loads (below), now. The loads list, for each
-- other live member that takes lanes, its unexpired lanes and whether its
-- node id (then instance) sorts before the instance's ('b') or not ('a'):
-- '2b,1a'; NULL when there is none. When the lanes do not divide evenly,
-- the members that sort first hold one more.
SELECT l.holder, l.instance, l.fencing_token, l.acquired_at, l.renewed_at, l.expires_at,
       (SELECT count(*) FROM {{prefix}}lanes WHERE scope = ?1 AND renewed_at > c.now_ms - ?2),
       (SELECT count(*) FROM {{prefix}}lanes WHERE scope = ?3 AND instance = ?4 AND expires_at > c.now_ms),
       (SELECT count(*) FROM {{prefix}}nodes WHERE scope = ?5 AND instance <> ?6 AND status = 'active'
            AND takes_lanes = 1 AND last_seen > c.now_ms - ?7),
       (SELECT count(*) FROM {{prefix}}nodes o JOIN {{prefix}}nodes me ON me.scope = o.scope AND me.instance = ?8
            WHERE o.scope = ?9 AND o.node_id = ?10 AND o.instance <> me.instance AND o.status = 'active'
              AND o.last_seen > c.now_ms - ?11
              AND (o.started_at < me.started_at OR (o.started_at = me.started_at AND o.instance < me.instance))),
       (SELECT group_concat(x.n || x.b, ',') FROM (
            SELECT (SELECT count(*) FROM {{prefix}}lanes h WHERE h.scope = o.scope AND h.instance = o.instance
                        AND h.expires_at > c.now_ms) AS n,
                   CASE WHEN o.node_id < me.node_id OR (o.node_id = me.node_id AND o.instance < me.instance) THEN 'b' ELSE 'a' END AS b
            FROM {{prefix}}nodes o JOIN {{prefix}}nodes me ON me.scope = o.scope AND me.instance = ?12
            WHERE o.scope = ?13 AND o.instance <> ?14 AND o.status = 'active' AND o.takes_lanes = 1
              AND o.last_seen > c.now_ms - ?15) x),
       c.now_ms
FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now_ms) AS c
LEFT JOIN {{prefix}}lanes l ON l.scope = ?16 AND l.lane = ?17;

-- name: lane_claim
-- args: holder, instance, ttl ms, scope, lane, instance, timeout ms (unused:
-- busy_timeout bounds SQLite's waits). Claims a lane that is free or
-- expired (a new token) or renews the instance's own (the same token), in
-- the caller's transaction, which holds the write lock until it ends.
-- Returns holder, instance, token, acquired, renewed, expires, now; no row
-- when the lane is held by another instance or has no row.
UPDATE {{prefix}}lanes
SET fencing_token = CASE WHEN expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) THEN fencing_token + 1 ELSE fencing_token END,
    acquired_at   = CASE WHEN expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)
                         THEN CAST(unixepoch('subsec') * 1000 AS INTEGER) ELSE acquired_at END,
    holder        = ?1,
    instance      = ?2,
    renewed_at    = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at    = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?3
WHERE scope = ?4 AND lane = ?5
  AND ((instance = ?6 AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER) AND expires_at > renewed_at)
       OR expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER))
  AND ?7 IS NOT NULL
RETURNING holder, instance, fencing_token, acquired_at, renewed_at, expires_at, renewed_at;

-- name: lane_read
-- args: scope, lane. Returns what lane_claim returns.
SELECT holder, instance, fencing_token, acquired_at, renewed_at, expires_at,
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM {{prefix}}lanes WHERE scope = ?1 AND lane = ?2;

-- name: lane_create
-- args: scope, lane. A free lane row with token 0, if there is none.
INSERT INTO {{prefix}}lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at)
VALUES (?1, ?2, '', '', 0, 0, 0, 0)
ON CONFLICT (scope, lane) DO NOTHING;

-- name: lane_renew
-- args: ttl ms, scope, instance. Renews every unexpired lane of the
-- instance, in one statement; not a lane a release or an operator ended
-- (expires_at = renewed_at), as on the other dialects.
UPDATE {{prefix}}lanes
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?1
WHERE scope = ?2 AND instance = ?3 AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER)
  AND expires_at > renewed_at;

-- name: lane_report
-- args: scope, window ms, scope, instance, window ms, instance, scope,
-- instance, window ms, scope, scope, instance. One row per unexpired lane
-- of the instance (one row with NULL lane columns when it has none): the
-- lanes of scope held within the window, the other live members that take
-- lanes, their loads (as in lane_peek), the config version (NULL when none), now, lane,
-- token, acquired, expires.
SELECT (SELECT count(*) FROM {{prefix}}lanes WHERE scope = ?1 AND renewed_at > c.now_ms - ?2),
       (SELECT count(*) FROM {{prefix}}nodes WHERE scope = ?3 AND instance <> ?4 AND status = 'active'
            AND takes_lanes = 1 AND last_seen > c.now_ms - ?5),
       (SELECT group_concat(x.n || x.b, ',') FROM (
            SELECT (SELECT count(*) FROM {{prefix}}lanes h WHERE h.scope = o.scope AND h.instance = o.instance
                        AND h.expires_at > c.now_ms) AS n,
                   CASE WHEN o.node_id < me.node_id OR (o.node_id = me.node_id AND o.instance < me.instance) THEN 'b' ELSE 'a' END AS b
            FROM {{prefix}}nodes o JOIN {{prefix}}nodes me ON me.scope = o.scope AND me.instance = ?6
            WHERE o.scope = ?7 AND o.instance <> ?8 AND o.status = 'active' AND o.takes_lanes = 1
              AND o.last_seen > c.now_ms - ?9) x),
       (SELECT config_version FROM {{prefix}}config WHERE scope = ?10),
       c.now_ms, l.lane, l.fencing_token, l.acquired_at, l.expires_at
FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now_ms) AS c
LEFT JOIN {{prefix}}lanes l ON l.scope = ?11 AND l.instance = ?12 AND l.expires_at > c.now_ms;

-- name: lane_list
-- args: scope. Every lane of scope, by key: lane, holder, instance, token,
-- acquired, renewed, expires, now. For operators (clusterctl lanes).
SELECT lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at,
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM {{prefix}}lanes WHERE scope = ?1 ORDER BY lane;

-- name: lane_expire
-- args: scope, lane, token. An operator ends the claim of a lane under
-- that token at once, whoever holds it (clusterctl release -lane), and no
-- other; the token is kept.
UPDATE {{prefix}}lanes
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE scope = ?1 AND lane = ?2 AND fencing_token = ?3
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: lane_release
-- args: scope, lane, holder, instance. Ends the instance's claim at once,
-- keeping the token; renewed_at records when, for the fair share's window.
UPDATE {{prefix}}lanes
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE scope = ?1 AND lane = ?2 AND holder = ?3 AND instance = ?4
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: lane_release_all
-- args: scope, holder, instance. Ends every claim of the instance at once.
UPDATE {{prefix}}lanes
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE scope = ?1 AND holder = ?2 AND instance = ?3
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: lane_join
-- args: scope, instance. The member takes lanes: it counts towards their
-- fair share while it is live.
UPDATE {{prefix}}nodes SET takes_lanes = 1 WHERE scope = ?1 AND instance = ?2;

-- name: config_read
-- args: scope.
SELECT config_version FROM {{prefix}}config WHERE scope = ?1;

-- name: config_create
-- args: scope. The version row at 0, if there is none. The row proposed
-- carries the current version, which the insert guard (there for REPLACE)
-- accepts.
INSERT INTO {{prefix}}config (scope, config_version, updated_at)
SELECT ?1, COALESCE((SELECT config_version FROM {{prefix}}config WHERE scope = ?1), 0),
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE true
ON CONFLICT (scope) DO NOTHING;

-- name: config_bump
-- args: scope. Increments the version atomically (creating it at 1) and
-- returns it. The row proposed carries the next version, as config_create's
-- carries the current one.
INSERT INTO {{prefix}}config (scope, config_version, updated_at)
SELECT ?1, COALESCE((SELECT config_version FROM {{prefix}}config WHERE scope = ?1), 0) + 1,
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE true
ON CONFLICT (scope) DO UPDATE SET
    config_version = config_version + 1,
    updated_at     = excluded.updated_at
RETURNING config_version;

-- name: node_live
-- args: scope, node id, timeout ms. Counts the live rows of a node id: active
-- and seen within the row's own timeout (the given one for a row without),
-- by the database clock.
SELECT count(*) FROM {{prefix}}nodes
WHERE scope = ?1 AND node_id = ?2 AND status = 'active'
  AND last_seen > CAST(unixepoch('subsec') * 1000 AS INTEGER) - CASE WHEN timeout_ms > 0 THEN timeout_ms ELSE ?3 END;

-- name: node_forget
-- args: scope, node id, timeout ms. Deletes the rows of a node id that are
-- not live (as node_live judges). A live row stays, however the call raced
-- with it.
DELETE FROM {{prefix}}nodes
WHERE scope = ?1 AND node_id = ?2
  AND (status <> 'active' OR last_seen <= CAST(unixepoch('subsec') * 1000 AS INTEGER) - CASE WHEN timeout_ms > 0 THEN timeout_ms ELSE ?3 END);
