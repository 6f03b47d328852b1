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
-- holder: granted, holder, instance, token, expires, endpoint, now, and
-- whether this database session ran the warm-up below. The statement is
-- the function {{prefix}}acquire of the schema (schema/postgres.sql), which
-- says what it does and why it is a function.
SELECT granted, holder, instance, fencing_token, expires_at, endpoint, now_ms, warm
FROM {{prefix}}acquire($1, $2, $3, $4, $5);

-- name: poll
-- args: name, instance. A follower's routine attempt, when the lease was
-- held at its last one and it polls (it hears no releases): the membership
-- heartbeat that an attempt carries, and the lease row as leader reads it.
-- It never grants (the follower attempts when the row is free or expired),
-- so it commits without waiting for its WAL flush, like a refused attempt,
-- and costs the server about half what an attempt planned at each call
-- does (through a transaction pooler pgx parses and plans every statement
-- at each call; the acquire function then plans only its own call).
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms,
           set_config('synchronous_commit', 'off', true) AS async
), seen AS (
    UPDATE {{prefix}}nodes SET last_seen = (SELECT now_ms FROM clock)
    WHERE scope = $1 AND instance = $2 AND status = 'active'
)
SELECT l.holder, l.instance, l.fencing_token, l.expires_at, l.endpoint, c.now_ms
FROM {{prefix}}lease l, clock c
WHERE l.name = $1;

-- name: warm
-- args: (none; {{acquire}} is the acquire query above).
-- Run by a follower whose acquisition was refused on a database session
-- that has not run it yet. A session's first grant costs about twice a
-- later one (bench/pgbench/firstgrant.sh): it compiles the trigger
-- functions a grant fires (lease_guard's update path, lease_mark,
-- high_water_guard) and plans their statements, which a refused attempt
-- never reaches, and plans the grant path of the acquire function, which
-- then keeps that plan for the session. That grant is the handoff everyone waits for, so
-- the follower pays it beforehand: the real acquire query grants a scratch
-- lease twice (inserted, then granted again over its expired term) inside
-- a subtransaction that is rolled back, so nothing is left, no fencing
-- token of a real lease moves and no real row is locked. The scratch name
-- begins with a space, which no Config.LeaseName may, and ends with
-- {{scratch}}, random hex digits of the provider's own, so that followers
-- warming up at once do not wait on one another's scratch row (through a
-- pooler, a wait would hold a server connection). Best effort: any
-- error rolls the subtransaction back the same way, and the session is
-- marked done either way (a session-level setting named after the table
-- prefix), so it runs once per session. One statement: nothing is held
-- open between round trips, through a pooler too.
DO $warm$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    BEGIN
        EXECUTE $grant$ {{acquire}} $grant$ USING ''::text, ''::text, 0::bigint, ''::text, ' sqlfence warm-up {{scratch}}'::text;
        EXECUTE $grant$ {{acquire}} $grant$ USING ''::text, ''::text, 0::bigint, ''::text, ' sqlfence warm-up {{scratch}}'::text;
        RAISE EXCEPTION 'sqlfence: warm-up done; rolling it back';
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
    PERFORM set_config('sqlfence.{{prefix}}warm', '1', false);
END
$warm$;

-- name: renew
-- args: ttl ms, name, holder, instance, token. Returns the new expiry. The
-- renew is also the leader's membership heartbeat. Not a term a release
-- ended (expires_at = renewed_at), even one whose release committed while
-- this statement, its clock read, waited for the row's lock.
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
  AND l.expires_at > c.now_ms AND l.expires_at > l.renewed_at
RETURNING l.expires_at;

-- name: release
-- args: name, holder, instance, token. Ends that term, if it still holds.
-- One statement: the UPDATE ends the term by the database clock (expiry
-- now, the token kept), and pg_notify tells the listening followers,
-- with the lease name, on channel {{prefix}}lease; the notification
-- is delivered when the transaction commits. It returns one row when it
-- ended a term, none otherwise. A node's own release commits without
-- waiting for its WAL flush (synchronous_commit off for this transaction
-- only): one flush less on every handoff; a release lost in a server
-- crash leaves the lease held until it expires, as if never asked for.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms,
           set_config('synchronous_commit', 'off', true) AS async
), ended AS (
    UPDATE {{prefix}}lease AS l SET renewed_at = c.now_ms, expires_at = c.now_ms
    FROM clock c
    WHERE l.name = $1 AND l.holder = $2 AND l.instance = $3 AND l.fencing_token = $4 AND l.expires_at > c.now_ms
    RETURNING l.name
)
SELECT pg_notify('{{prefix}}lease', name) FROM ended;

-- name: release_instance
-- args: name, holder, instance. Ends whatever term the instance holds
-- (Shutdown, after an attempt whose answer was lost).
-- One statement: the UPDATE ends the term by the database clock (expiry
-- now, the token kept), and pg_notify tells the listening followers,
-- with the lease name, on channel {{prefix}}lease; the notification
-- is delivered when the transaction commits. It returns one row when it
-- ended a term, none otherwise. A node's own release commits without
-- waiting for its WAL flush (synchronous_commit off for this transaction
-- only): one flush less on every handoff; a release lost in a server
-- crash leaves the lease held until it expires, as if never asked for.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms,
           set_config('synchronous_commit', 'off', true) AS async
), ended AS (
    UPDATE {{prefix}}lease AS l SET renewed_at = c.now_ms, expires_at = c.now_ms
    FROM clock c
    WHERE l.name = $1 AND l.holder = $2 AND l.instance = $3 AND l.expires_at > c.now_ms
    RETURNING l.name
)
SELECT pg_notify('{{prefix}}lease', name) FROM ended;

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
-- args: lease table name. The schema of the cluster tables: the first
-- schema of the search_path that has the lease table (never the session's
-- temporary schema), else the one New creates them in; and how many
-- schemas of the search_path have it, and which, at most one of which New
-- accepts (a
-- table of the same name in an earlier schema would otherwise stand in
-- for the lease on every node started from then on). Every statement then
-- names its tables in that schema, so a temporary table of the same name,
-- which PostgreSQL looks up first, cannot stand in for them.
WITH found AS (
    SELECT s.name, s.pos
    FROM unnest(current_schemas(false)) WITH ORDINALITY AS s(name, pos)
    JOIN pg_namespace n ON n.nspname = s.name
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = $1 AND c.relkind IN ('r', 'p')
    WHERE n.oid <> pg_my_temp_schema())
SELECT COALESCE((SELECT name FROM found ORDER BY pos LIMIT 1), current_schema()),
       (SELECT count(*) FROM found),
       COALESCE((SELECT string_agg(quote_ident(name), ', ' ORDER BY pos) FROM found), '');

-- name: schema_lock
-- args: lock key, lock timeout ms. Run inside the schema transaction: the
-- advisory lock ends with it, and lock_timeout keeps the DDL from queueing
-- behind an open transaction on the cluster tables.
SELECT pg_advisory_xact_lock(hashtext($1)), set_config('lock_timeout', $2::text, true);

-- name: node_recycle
-- args: instance, node id, host, pid, endpoint, timeout ms, scope,
-- retention ms, crashed retention ms (this order on every dialect, MySQL's placeholders
-- being positional). A joining node takes over the row of a member of the
-- scope that left (Shutdown) longer than the retention ago, or that was
-- last seen longer than the crashed retention ago while still marked
-- active (its process died without Shutdown), the oldest first, rather
-- than adding one, so restarts do not grow the table, with no DELETE
-- right. The crashed retention is days: a process paused that long finds
-- its row gone (Seen, where it runs, reports it and the node joins again).
-- No row updated: node_join adds one.
UPDATE {{prefix}}nodes AS m
SET instance = $1, node_id = $2, host = $3, pid = $4, endpoint = $5, timeout_ms = $6,
    started_at = c.now_ms, last_seen = c.now_ms, status = 'active', takes_lanes = 0
FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) c
WHERE (m.scope, m.instance) = (
    SELECT o.scope, o.instance FROM {{prefix}}nodes o
    WHERE o.scope = $7
      AND (o.status = 'left' AND o.last_seen < floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - $8::bigint
        OR o.status = 'active' AND o.last_seen < floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - $9::bigint)
    ORDER BY o.last_seen, o.instance LIMIT 1 FOR UPDATE SKIP LOCKED);

-- name: node_join
-- args: scope, instance, node id, host, pid, endpoint, timeout ms.
INSERT INTO {{prefix}}nodes AS m (scope, instance, node_id, host, pid, endpoint, timeout_ms, started_at, last_seen, status)
VALUES ($1, $2, $3, $4, $5, $6, $7, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'active')
ON CONFLICT (scope, instance) DO UPDATE SET
    node_id = excluded.node_id, host = excluded.host, pid = excluded.pid, endpoint = excluded.endpoint,
    timeout_ms = excluded.timeout_ms, last_seen = excluded.last_seen, status = 'active';

-- name: node_seen
-- args: scope, instance.
UPDATE {{prefix}}nodes SET last_seen = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, status = 'active'
WHERE scope = $1 AND instance = $2;

-- name: node_row
-- args: scope, instance. One row when the instance has a membership row
-- (Seen asks when node_seen reports no row updated).
SELECT 1 FROM {{prefix}}nodes WHERE scope = $1 AND instance = $2;

-- name: node_leave
-- args: scope, instance.
UPDATE {{prefix}}nodes SET last_seen = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, status = 'left'
WHERE scope = $1 AND instance = $2;

-- name: members
-- args: scope. Returns node id, instance, host, pid, endpoint, started at,
-- last seen, status, timeout ms, leads (the lease row names it,
-- unexpired), now. The lease row decides who leads: at most one member
-- does.
SELECT n.node_id, n.instance, n.host, n.pid, n.endpoint, n.started_at, n.last_seen, n.status, n.timeout_ms,
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
-- args: name, token. An operator ends the term of that token at once
-- (clusterctl release -force), and no other: a term that changed hands
-- since the operator read it is left alone.
-- One statement: the UPDATE ends the term by the database clock (expiry
-- now, the token kept), and pg_notify tells the listening followers,
-- with the lease name, on channel {{prefix}}lease; the notification
-- is delivered when the transaction commits. It returns one row when it
-- ended a term, none otherwise. Unlike a node's release it waits for its
-- WAL flush.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), ended AS (
    UPDATE {{prefix}}lease AS l SET renewed_at = c.now_ms, expires_at = c.now_ms
    FROM clock c
    WHERE l.name = $1 AND l.fencing_token = $2::bigint AND l.expires_at > c.now_ms
    RETURNING l.name
)
SELECT pg_notify('{{prefix}}lease', name) FROM ended;

-- name: lease_retire
-- args: name. An operator retires a lease name: the row stays, with its
-- token (a name used again continues from it), but names no holder.
UPDATE {{prefix}}lease SET holder = '', instance = '', endpoint = ''
WHERE name = $1 AND expires_at <= floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;

-- name: nodes_retire
-- args: scope. The members of a retired lease name have left.
UPDATE {{prefix}}nodes SET status = 'left' WHERE scope = $1;

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
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
SELECT l.holder, l.instance, l.fencing_token, l.acquired_at, l.renewed_at, l.expires_at,
       (SELECT count(*) FROM {{prefix}}lanes WHERE scope = $1 AND renewed_at > c.now_ms - $2::bigint),
       (SELECT count(*) FROM {{prefix}}lanes WHERE scope = $3 AND instance = $4 AND expires_at > c.now_ms),
       (SELECT count(*) FROM {{prefix}}nodes WHERE scope = $5 AND instance <> $6 AND status = 'active'
            AND takes_lanes = 1 AND last_seen > c.now_ms - $7::bigint),
       (SELECT count(*) FROM {{prefix}}nodes o JOIN {{prefix}}nodes me ON me.scope = o.scope AND me.instance = $8
            WHERE o.scope = $9 AND o.node_id = $10 AND o.instance <> me.instance AND o.status = 'active'
              AND o.last_seen > c.now_ms - $11::bigint
              AND (o.started_at < me.started_at OR (o.started_at = me.started_at AND o.instance < me.instance))),
       (SELECT string_agg(x.n::text || x.b, ',') FROM (
            SELECT (SELECT count(*) FROM {{prefix}}lanes h WHERE h.scope = o.scope AND h.instance = o.instance
                        AND h.expires_at > c.now_ms) AS n,
                   CASE WHEN o.node_id < me.node_id OR (o.node_id = me.node_id AND o.instance < me.instance) THEN 'b' ELSE 'a' END AS b
            FROM {{prefix}}nodes o JOIN {{prefix}}nodes me ON me.scope = o.scope AND me.instance = $12
            WHERE o.scope = $13 AND o.instance <> $14 AND o.status = 'active' AND o.takes_lanes = 1
              AND o.last_seen > c.now_ms - $15::bigint) x),
       c.now_ms
FROM clock c LEFT JOIN {{prefix}}lanes l ON l.scope = $16 AND l.lane = $17;

-- name: lane_claim
-- args: holder, instance, ttl ms, scope, lane, instance, timeout ms.
-- Claims a lane that is free or expired (a new token) or renews the
-- instance's own (the same token), in the caller's transaction, whose row
-- lock holds the claim until it ends. Returns holder, instance, token,
-- acquired, renewed, expires, now; no row when the lane is held by another
-- instance or has no row. The set_config calls bound the wait for the row
-- and any idle moment of the transaction, as fence does. A renewal skips
-- a claim a release or an operator ended (expires_at = renewed_at), even
-- one ended while this statement, its clock read, waited for the row: the
-- next claim gets a new token.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
UPDATE {{prefix}}lanes AS l
SET fencing_token = CASE WHEN l.expires_at <= c.now_ms THEN l.fencing_token + 1 ELSE l.fencing_token END,
    acquired_at   = CASE WHEN l.expires_at <= c.now_ms THEN c.now_ms ELSE l.acquired_at END,
    holder        = $1,
    instance      = $2,
    renewed_at    = c.now_ms,
    expires_at    = c.now_ms + $3::bigint
FROM clock c
WHERE l.scope = $4 AND l.lane = $5
  AND ((l.instance = $6 AND l.expires_at > c.now_ms AND l.expires_at > l.renewed_at) OR l.expires_at <= c.now_ms)
  AND set_config('lock_timeout', $7::text, true) IS NOT NULL
  AND set_config('idle_in_transaction_session_timeout', $7::text, true) IS NOT NULL
RETURNING l.holder, l.instance, l.fencing_token, l.acquired_at, l.renewed_at, l.expires_at, c.now_ms;

-- name: lane_read
-- args: scope, lane. Returns what lane_claim returns.
SELECT holder, instance, fencing_token, acquired_at, renewed_at, expires_at,
       floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM {{prefix}}lanes WHERE scope = $1 AND lane = $2;

-- name: lane_create
-- args: scope, lane. A free lane row with token 0, if there is none.
INSERT INTO {{prefix}}lanes (scope, lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, '', '', 0, 0, 0, 0)
ON CONFLICT (scope, lane) DO NOTHING;

-- name: lane_refresh
-- args: ttl ms, scope, instance, window ms. The heartbeat of a node's
-- lanes, in one statement: renews the instance's unexpired lanes (skipping
-- those a transaction of its own holds, which renewed them when it claimed
-- them) and returns, on one row per lane of the instance (one row with
-- NULL lane columns when it has none): the lanes of scope held within the
-- window, the other live members that take lanes, their loads (as in
-- lane_peek), the config version (NULL when none), now, lane, token, acquired, expires. A lane a
-- release or an operator ended (expires_at = renewed_at) is not renewed,
-- even when that release committed after this statement read its clock.
-- The census is counted once, not once per lane (MATERIALIZED): counted
-- per row, a generic plan's estimate over a scope with a long history
-- passed jit_above_cost, and JIT compiling took 250 ms a heartbeat.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), renewed AS (
    UPDATE {{prefix}}lanes AS l
    SET renewed_at = c.now_ms, expires_at = c.now_ms + $1::bigint
    FROM clock c
    WHERE l.scope = $2 AND l.instance = $3 AND l.expires_at > c.now_ms AND l.expires_at > l.renewed_at
      AND l.lane IN (
          SELECT k.lane FROM {{prefix}}lanes k, clock c2
          WHERE k.scope = $2 AND k.instance = $3 AND k.expires_at > c2.now_ms AND k.expires_at > k.renewed_at
          FOR UPDATE OF k SKIP LOCKED)
    RETURNING l.lane, l.fencing_token, l.acquired_at, l.expires_at
), mine AS (
    SELECT lane, fencing_token, acquired_at, expires_at FROM renewed
    UNION ALL
    SELECT l.lane, l.fencing_token, l.acquired_at, l.expires_at
    FROM {{prefix}}lanes l, clock c
    WHERE l.scope = $2 AND l.instance = $3 AND l.expires_at > c.now_ms
      AND NOT EXISTS (SELECT 1 FROM renewed r WHERE r.lane = l.lane)
), census AS MATERIALIZED (
    SELECT (SELECT count(*) FROM {{prefix}}lanes WHERE scope = $2 AND renewed_at > c.now_ms - $4::bigint) AS lanes,
           (SELECT count(*) FROM {{prefix}}nodes WHERE scope = $2 AND instance <> $3 AND status = 'active'
                AND takes_lanes = 1 AND last_seen > c.now_ms - $4::bigint) AS members,
           (SELECT string_agg(x.n::text || x.b, ',') FROM (
                SELECT (SELECT count(*) FROM {{prefix}}lanes h WHERE h.scope = o.scope AND h.instance = o.instance
                            AND h.expires_at > c.now_ms) AS n,
                       CASE WHEN o.node_id < me.node_id OR (o.node_id = me.node_id AND o.instance < me.instance) THEN 'b' ELSE 'a' END AS b
                FROM {{prefix}}nodes o JOIN {{prefix}}nodes me ON me.scope = o.scope AND me.instance = $3
                WHERE o.scope = $2 AND o.instance <> $3 AND o.status = 'active' AND o.takes_lanes = 1
                  AND o.last_seen > c.now_ms - $4::bigint) x) AS loads,
           (SELECT config_version FROM {{prefix}}config WHERE scope = $2) AS version
    FROM clock c
)
SELECT n.lanes, n.members, n.loads, n.version, c.now_ms, m.lane, m.fencing_token, m.acquired_at, m.expires_at
FROM clock c CROSS JOIN census n LEFT JOIN mine m ON true;

-- name: lane_list
-- args: scope. Every lane of scope, by key: lane, holder, instance, token,
-- acquired, renewed, expires, now. For operators (clusterctl lanes).
SELECT lane, holder, instance, fencing_token, acquired_at, renewed_at, expires_at,
       floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM {{prefix}}lanes WHERE scope = $1 ORDER BY lane;

-- name: lane_expire
-- args: scope, lane, token. An operator ends the claim of a lane under
-- that token at once, whoever holds it (clusterctl release -lane), and no
-- other; the token is kept.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
UPDATE {{prefix}}lanes AS l
SET renewed_at = c.now_ms, expires_at = c.now_ms
FROM clock c
WHERE l.scope = $1 AND l.lane = $2 AND l.fencing_token = $3 AND l.expires_at > c.now_ms;

-- name: lane_release
-- args: scope, lane, holder, instance. Ends the instance's claim at once,
-- keeping the token; renewed_at records when, for the fair share's window.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
UPDATE {{prefix}}lanes AS l
SET renewed_at = c.now_ms, expires_at = c.now_ms
FROM clock c
WHERE l.scope = $1 AND l.lane = $2 AND l.holder = $3 AND l.instance = $4 AND l.expires_at > c.now_ms;

-- name: lane_release_all
-- args: scope, holder, instance. Ends every claim of the instance at once.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
UPDATE {{prefix}}lanes AS l
SET renewed_at = c.now_ms, expires_at = c.now_ms
FROM clock c
WHERE l.scope = $1 AND l.holder = $2 AND l.instance = $3 AND l.expires_at > c.now_ms;

-- name: lane_join
-- args: scope, instance. The member takes lanes: it counts towards their
-- fair share while it is live.
UPDATE {{prefix}}nodes SET takes_lanes = 1 WHERE scope = $1 AND instance = $2;

-- name: config_read
-- args: scope.
SELECT config_version FROM {{prefix}}config WHERE scope = $1;

-- name: config_create
-- args: scope. The version row at 0, if there is none.
INSERT INTO {{prefix}}config (scope, config_version, updated_at)
VALUES ($1, 0, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (scope) DO NOTHING;

-- name: config_bump
-- args: scope. Increments the version atomically (creating it at 1) and
-- returns it.
INSERT INTO {{prefix}}config AS k (scope, config_version, updated_at)
VALUES ($1, 1, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (scope) DO UPDATE SET
    config_version = k.config_version + 1,
    updated_at     = excluded.updated_at
RETURNING config_version;

-- name: node_live
-- args: scope, node id, timeout ms. Counts the live rows of a node id: active
-- and seen within the row's own timeout (the given one for a row without),
-- by the database clock.
SELECT count(*) FROM {{prefix}}nodes
WHERE scope = $1 AND node_id = $2 AND status = 'active'
  AND last_seen > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - CASE WHEN timeout_ms > 0 THEN timeout_ms ELSE $3::bigint END;

-- name: node_forget
-- args: scope, node id, timeout ms. Deletes the rows of a node id that are
-- not live (as node_live judges). A live row stays, however the call raced
-- with it.
DELETE FROM {{prefix}}nodes
WHERE scope = $1 AND node_id = $2
  AND (status <> 'active' OR last_seen <= floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - CASE WHEN timeout_ms > 0 THEN timeout_ms ELSE $3::bigint END);
