-- sqlfence/cluster schema for PostgreSQL 12 or later, version 3.
-- {{prefix}} is replaced by Config.TablePrefix (validated, default
-- "cluster_"). Times are unix milliseconds by the database clock,
-- clock_timestamp(). A statement ends at a line that starts in column 0 and
-- ends with ";". Run the whole file in one transaction (New does; so do
-- goose, atlas and flyway by default): its first statements pin the
-- search_path the guard functions keep.
--
-- The file is idempotent and describes the whole current schema: New runs
-- it, in one transaction under an advisory lock, only when
-- {{prefix}}schema_version records an older version, so a changed trigger
-- body reaches every existing database.
--
-- Guard errors carry SQLSTATEs of class SF, which the package maps to its
-- sentinel errors:
--   SF001 stale fencing token          SF002 chain tip moving backwards
--   SF003 chain tip deleted or renamed SF004 lease deleted or renamed
--   SF005 chain tip rewritten          SF006 fencing token lowered
--   SF007 fencing token below the high-water mark (a lease or lane row went
--         back)                      SF008 lane deleted or renamed
-- Every guard function keeps the search_path it was created with: the
-- schema of the tables, then pg_temp, listed last, so a session's temporary
-- table cannot stand in for ours (unlisted, pg_temp would come first).

CREATE TABLE IF NOT EXISTS {{prefix}}schema_version (
    version    INTEGER PRIMARY KEY,
    applied_at BIGINT  NOT NULL
);

-- For the rest of this transaction: this schema, then pg_temp. The guard
-- functions below keep it (SET search_path FROM CURRENT).
SELECT set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);

-- One row per lease name. The fencing token only ever grows: it is
-- incremented by every acquisition and kept by release and expiry.
CREATE TABLE IF NOT EXISTS {{prefix}}lease (
    name          TEXT   PRIMARY KEY,
    holder        TEXT   NOT NULL,
    instance      TEXT   NOT NULL,
    fencing_token BIGINT NOT NULL CHECK (fencing_token >= 0),
    acquired_at   BIGINT NOT NULL,
    renewed_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    endpoint      TEXT   NOT NULL DEFAULT ''
);

-- The highest fencing token ever granted per lease ('lease/<name>') and the
-- highest counter ever recorded per chain tip ('chain/<name>'), kept apart
-- from the rows they guard: a lease or tip row that went back (truncated,
-- replaced, restored on its own) is refused or detected against it.
CREATE TABLE IF NOT EXISTS {{prefix}}high_water (
    scope TEXT   PRIMARY KEY,
    value BIGINT NOT NULL CHECK (value >= 0)
);

CREATE OR REPLACE FUNCTION {{prefix}}high_water_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $guard$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'sqlfence: high-water marks may not be deleted' USING ERRCODE = 'SF006';
    END IF;
    IF NEW.scope <> OLD.scope OR NEW.value < OLD.value THEN
        RAISE EXCEPTION 'sqlfence: the high-water mark of % may not go back from % to %',
            OLD.scope, OLD.value, NEW.value USING ERRCODE = 'SF006';
    END IF;
    RETURN NEW;
END
$guard$;

DROP TRIGGER IF EXISTS {{prefix}}high_water_guard ON {{prefix}}high_water;

CREATE TRIGGER {{prefix}}high_water_guard
    BEFORE UPDATE OR DELETE ON {{prefix}}high_water
    FOR EACH ROW EXECUTE FUNCTION {{prefix}}high_water_guard();

DROP TRIGGER IF EXISTS {{prefix}}high_water_truncate ON {{prefix}}high_water;

CREATE TRIGGER {{prefix}}high_water_truncate
    BEFORE TRUNCATE ON {{prefix}}high_water
    FOR EACH STATEMENT EXECUTE FUNCTION {{prefix}}high_water_guard();

-- Fencing tokens must never go back or be granted twice: refuse lowering a
-- token, renaming, deleting or truncating a lease row, and any token below
-- the high-water mark; raise the mark with every acquisition.
CREATE OR REPLACE FUNCTION {{prefix}}lease_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $guard$
DECLARE
    mark BIGINT;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'sqlfence: the lease table may not be truncated: fencing tokens would start again at 1'
            USING ERRCODE = 'SF004';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'sqlfence: lease % may not be deleted: its fencing tokens would start again at 1',
            OLD.name USING ERRCODE = 'SF004';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.name <> OLD.name THEN
            RAISE EXCEPTION 'sqlfence: lease % may not be renamed', OLD.name USING ERRCODE = 'SF004';
        END IF;
        IF NEW.fencing_token < OLD.fencing_token THEN
            RAISE EXCEPTION 'sqlfence: the fencing token of lease % may not go back from % to %',
                OLD.name, OLD.fencing_token, NEW.fencing_token USING ERRCODE = 'SF006';
        END IF;
        IF NEW.fencing_token = OLD.fencing_token THEN
            -- A token belongs to one holder: a term changes hands only
            -- with a new token. Naming no holder once the term is over
            -- (an operator retiring the lease) gives the token to nobody.
            IF (NEW.holder <> OLD.holder OR NEW.instance <> OLD.instance)
               AND NOT (NEW.holder = '' AND NEW.instance = ''
                        AND NEW.expires_at <= floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) THEN
                RAISE EXCEPTION 'sqlfence: lease % may not change hands under fencing token %: a new holder needs a new token',
                    OLD.name, OLD.fencing_token USING ERRCODE = 'SF009';
            END IF;
            RETURN NEW; -- renew or release: the mark is already this token
        END IF;
    END IF;
    SELECT value INTO mark FROM {{prefix}}high_water WHERE scope = 'lease/' || NEW.name;
    -- An INSERT ... ON CONFLICT proposing a row that exists (the acquire
    -- function's) is checked by the UPDATE it turns into.
    IF TG_OP = 'INSERT' AND EXISTS (SELECT 1 FROM {{prefix}}lease WHERE name = NEW.name) THEN
        RETURN NEW;
    END IF;
    IF NEW.fencing_token < mark THEN
        RAISE EXCEPTION 'sqlfence: lease % would grant fencing token %, below the % already granted: the lease row went back',
            NEW.name, NEW.fencing_token, mark USING ERRCODE = 'SF007';
    END IF;
    RETURN NEW;
END
$guard$;

-- Raises the mark after a row is really inserted or granted a new token
-- (after, not before: an acquisition that finds the lease held proposes an
-- insert that never happens).
CREATE OR REPLACE FUNCTION {{prefix}}lease_mark() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $mark$
BEGIN
    INSERT INTO {{prefix}}high_water AS h (scope, value) VALUES ('lease/' || NEW.name, NEW.fencing_token)
        ON CONFLICT (scope) DO UPDATE SET value = excluded.value WHERE h.value < excluded.value;
    RETURN NULL;
END
$mark$;

DROP TRIGGER IF EXISTS {{prefix}}lease_guard ON {{prefix}}lease;

CREATE TRIGGER {{prefix}}lease_guard
    BEFORE INSERT OR UPDATE OR DELETE ON {{prefix}}lease
    FOR EACH ROW EXECUTE FUNCTION {{prefix}}lease_guard();

DROP TRIGGER IF EXISTS {{prefix}}lease_mark_insert ON {{prefix}}lease;

CREATE TRIGGER {{prefix}}lease_mark_insert
    AFTER INSERT ON {{prefix}}lease
    FOR EACH ROW EXECUTE FUNCTION {{prefix}}lease_mark();

DROP TRIGGER IF EXISTS {{prefix}}lease_mark_update ON {{prefix}}lease;

CREATE TRIGGER {{prefix}}lease_mark_update
    AFTER UPDATE ON {{prefix}}lease
    FOR EACH ROW WHEN (NEW.fencing_token > OLD.fencing_token)
    EXECUTE FUNCTION {{prefix}}lease_mark();

DROP TRIGGER IF EXISTS {{prefix}}lease_truncate ON {{prefix}}lease;

CREATE TRIGGER {{prefix}}lease_truncate
    BEFORE TRUNCATE ON {{prefix}}lease
    FOR EACH STATEMENT EXECUTE FUNCTION {{prefix}}lease_guard();

-- The recorded tip of each hash-chained table. The guard below makes the
-- database itself refuse a tip written under a stale fencing token, moving
-- backwards, rewritten at the same counter, renamed or deleted, so a paused
-- old leader cannot extend a chain and nobody can quietly rewind one.
CREATE TABLE IF NOT EXISTS {{prefix}}chain_tips (
    scope         TEXT   PRIMARY KEY,
    lease_name    TEXT   NOT NULL,
    at_counter    BIGINT NOT NULL CHECK (at_counter >= 0),
    row_hash      BYTEA  NOT NULL,
    fencing_token BIGINT NOT NULL CHECK (fencing_token > 0),
    updated_at    BIGINT NOT NULL
);

INSERT INTO {{prefix}}high_water (scope, value)
SELECT 'chain/' || scope, at_counter FROM {{prefix}}chain_tips
ON CONFLICT (scope) DO NOTHING;

CREATE OR REPLACE FUNCTION {{prefix}}chain_tips_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $guard$
DECLARE
    cur_token   BIGINT;
    cur_renewed BIGINT;
    cur_expires BIGINT;
    mark        BIGINT;
    now_ms      BIGINT := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'sqlfence: the chain tips table may not be truncated' USING ERRCODE = 'SF003';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'sqlfence: chain tip % may not be deleted', OLD.scope USING ERRCODE = 'SF003';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.scope <> OLD.scope THEN
        RAISE EXCEPTION 'sqlfence: chain tip % may not be renamed', OLD.scope USING ERRCODE = 'SF003';
    END IF;
    -- A tip keeps its lease: moved to another lease row, one the
    -- application's role may insert with any token, it would be written
    -- under a token no real term holds (version 3).
    IF TG_OP = 'UPDATE' AND NEW.lease_name <> OLD.lease_name THEN
        RAISE EXCEPTION 'sqlfence: chain tip % may not move from lease % to %', OLD.scope, OLD.lease_name, NEW.lease_name
            USING ERRCODE = 'SF003';
    END IF;
    -- FOR SHARE holds the lease row until this transaction ends, so no later
    -- term can be granted before this tip commits.
    SELECT fencing_token, renewed_at, expires_at INTO cur_token, cur_renewed, cur_expires
        FROM {{prefix}}lease WHERE name = NEW.lease_name FOR SHARE;
    IF NOT FOUND OR NEW.fencing_token <> cur_token OR cur_expires <= now_ms THEN
        RAISE EXCEPTION 'sqlfence: stale fencing token % for chain % (current token %)',
            NEW.fencing_token, NEW.scope, cur_token USING ERRCODE = 'SF001';
    END IF;
    -- A writer that vanishes now must not hold the lease row for hours: the
    -- server ends this transaction once it idles for the lease's TTL.
    PERFORM set_config('idle_in_transaction_session_timeout', (cur_expires - cur_renewed)::text, true);
    IF TG_OP = 'UPDATE' THEN
        IF NEW.fencing_token < OLD.fencing_token THEN
            RAISE EXCEPTION 'sqlfence: stale fencing token % for chain % (tip written under %)',
                NEW.fencing_token, NEW.scope, OLD.fencing_token USING ERRCODE = 'SF001';
        END IF;
        IF NEW.at_counter < OLD.at_counter THEN
            RAISE EXCEPTION 'sqlfence: chain % tip moving backwards from % to %',
                NEW.scope, OLD.at_counter, NEW.at_counter USING ERRCODE = 'SF002';
        END IF;
        IF NEW.at_counter = OLD.at_counter AND NEW.row_hash <> OLD.row_hash THEN
            RAISE EXCEPTION 'sqlfence: chain % tip at counter % may not be rewritten with another hash',
                NEW.scope, NEW.at_counter USING ERRCODE = 'SF005';
        END IF;
    END IF;
    SELECT value INTO mark FROM {{prefix}}high_water WHERE scope = 'chain/' || NEW.scope;
    IF NEW.at_counter < mark THEN
        RAISE EXCEPTION 'sqlfence: chain % tip moving backwards from % to %',
            NEW.scope, mark, NEW.at_counter USING ERRCODE = 'SF002';
    END IF;
    INSERT INTO {{prefix}}high_water AS h (scope, value) VALUES ('chain/' || NEW.scope, NEW.at_counter)
        ON CONFLICT (scope) DO UPDATE SET value = excluded.value WHERE h.value < excluded.value;
    RETURN NEW;
END
$guard$;

DROP TRIGGER IF EXISTS {{prefix}}chain_tips_guard ON {{prefix}}chain_tips;

CREATE TRIGGER {{prefix}}chain_tips_guard
    BEFORE INSERT OR UPDATE OR DELETE ON {{prefix}}chain_tips
    FOR EACH ROW EXECUTE FUNCTION {{prefix}}chain_tips_guard();

DROP TRIGGER IF EXISTS {{prefix}}chain_tips_truncate ON {{prefix}}chain_tips;

CREATE TRIGGER {{prefix}}chain_tips_truncate
    BEFORE TRUNCATE ON {{prefix}}chain_tips
    FOR EACH STATEMENT EXECUTE FUNCTION {{prefix}}chain_tips_guard();

-- Cluster-wide facts every node must agree on, one row per lease name.
CREATE TABLE IF NOT EXISTS {{prefix}}state (
    scope            TEXT   PRIMARY KEY,
    vault_key_fp     TEXT   NOT NULL,
    rotation_epoch   BIGINT NOT NULL DEFAULT 0,
    recorded_at      BIGINT NOT NULL,
    recorded_by_node TEXT   NOT NULL
);

-- Membership: one row per node process (instance) and lease name, written
-- at start, refreshed by the heartbeat (in the same statement as the lease
-- on PostgreSQL), marked 'left' on Shutdown. Liveness is judged from
-- last_seen by the database clock; which member leads, from the lease row.
CREATE TABLE IF NOT EXISTS {{prefix}}nodes (
    scope      TEXT   NOT NULL,
    instance   TEXT   NOT NULL,
    node_id    TEXT   NOT NULL,
    host       TEXT   NOT NULL,
    pid        BIGINT NOT NULL,
    endpoint   TEXT   NOT NULL DEFAULT '',
    started_at BIGINT NOT NULL,
    last_seen  BIGINT NOT NULL,
    status     TEXT   NOT NULL CHECK (status IN ('active', 'left')),
    -- 1 once the node claimed a lane: it counts towards the lanes' fair share.
    takes_lanes SMALLINT NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, instance)
);

-- Version 2: every member records its node timeout (its LeaseTTL and three
-- heartbeats, in ms), by which its own liveness is judged, so every reader
-- (Members, MembersHandler, clusterctl) agrees; 0 in a row written before.
ALTER TABLE {{prefix}}nodes ADD COLUMN IF NOT EXISTS timeout_ms BIGINT NOT NULL DEFAULT 0;

-- Lanes: partitioned work. One row per lane key of a lease name (scope),
-- naming the node process (instance) that owns the lane until expires_at,
-- by the database clock, under a fencing token of the lane's own: it grows
-- with every new claim and is kept by renewal, release and expiry. A row
-- with token 0 is a lane never claimed. Rows are never deleted, so a key
-- claimed again continues from its token; the highest token each lane was
-- granted is kept in high_water under 'lane/<length of scope>/<scope>/<lane>'
-- (the length keeps two scope and lane pairs from sharing a mark).
CREATE TABLE IF NOT EXISTS {{prefix}}lanes (
    scope         TEXT   NOT NULL,
    lane          TEXT   NOT NULL,
    holder        TEXT   NOT NULL,
    instance      TEXT   NOT NULL,
    fencing_token BIGINT NOT NULL CHECK (fencing_token >= 0),
    acquired_at   BIGINT NOT NULL,
    renewed_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    PRIMARY KEY (scope, lane)
);

-- What a claim and a keeper's heartbeat count reads only the
-- lanes held now or within the fair share's window, however many keys
-- the scope ever used (rows are never deleted): an instance's unexpired
-- lanes, and the lanes renewed or released since a moment.
CREATE INDEX IF NOT EXISTS {{prefix}}lanes_by_holding ON {{prefix}}lanes (scope, instance, expires_at);

CREATE INDEX IF NOT EXISTS {{prefix}}lanes_by_renewal ON {{prefix}}lanes (scope, renewed_at);

-- A lane's token never goes back and is never granted twice: refuse lowering
-- it, renaming, deleting or truncating a lane row, and a token below the
-- lane's high-water mark.
CREATE OR REPLACE FUNCTION {{prefix}}lanes_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $guard$
DECLARE
    mark BIGINT;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'sqlfence: the lanes table may not be truncated: lane fencing tokens would start again at 1'
            USING ERRCODE = 'SF008';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'sqlfence: lane % may not be deleted: its fencing tokens would start again at 1',
            OLD.lane USING ERRCODE = 'SF008';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.scope <> OLD.scope OR NEW.lane <> OLD.lane THEN
            RAISE EXCEPTION 'sqlfence: lane % may not be renamed', OLD.lane USING ERRCODE = 'SF008';
        END IF;
        IF NEW.fencing_token < OLD.fencing_token THEN
            RAISE EXCEPTION 'sqlfence: the fencing token of lane % may not go back from % to %',
                OLD.lane, OLD.fencing_token, NEW.fencing_token USING ERRCODE = 'SF006';
        END IF;
        IF NEW.fencing_token = OLD.fencing_token THEN
            IF NEW.holder <> OLD.holder OR NEW.instance <> OLD.instance THEN
                RAISE EXCEPTION 'sqlfence: lane % may not change hands under fencing token %: a new holder needs a new token',
                    OLD.lane, OLD.fencing_token USING ERRCODE = 'SF009';
            END IF;
            RETURN NEW; -- a renewal or release
        END IF;
    END IF;
    IF NEW.fencing_token = 0 THEN
        RETURN NEW; -- a lane never claimed
    END IF;
    SELECT value INTO mark FROM {{prefix}}high_water
        WHERE scope = 'lane/' || length(NEW.scope) || '/' || NEW.scope || '/' || NEW.lane;
    IF NEW.fencing_token < mark THEN
        RAISE EXCEPTION 'sqlfence: lane % would grant fencing token %, below the % already granted: the lane row went back',
            NEW.lane, NEW.fencing_token, mark USING ERRCODE = 'SF007';
    END IF;
    RETURN NEW;
END
$guard$;

-- Raises the lane's mark after a token is really granted.
CREATE OR REPLACE FUNCTION {{prefix}}lanes_mark() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $mark$
BEGIN
    INSERT INTO {{prefix}}high_water AS h (scope, value)
        VALUES ('lane/' || length(NEW.scope) || '/' || NEW.scope || '/' || NEW.lane, NEW.fencing_token)
        ON CONFLICT (scope) DO UPDATE SET value = excluded.value WHERE h.value < excluded.value;
    RETURN NULL;
END
$mark$;

DROP TRIGGER IF EXISTS {{prefix}}lanes_guard ON {{prefix}}lanes;

CREATE TRIGGER {{prefix}}lanes_guard
    BEFORE INSERT OR UPDATE OR DELETE ON {{prefix}}lanes
    FOR EACH ROW EXECUTE FUNCTION {{prefix}}lanes_guard();

DROP TRIGGER IF EXISTS {{prefix}}lanes_mark_insert ON {{prefix}}lanes;

CREATE TRIGGER {{prefix}}lanes_mark_insert
    AFTER INSERT ON {{prefix}}lanes
    FOR EACH ROW WHEN (NEW.fencing_token > 0)
    EXECUTE FUNCTION {{prefix}}lanes_mark();

DROP TRIGGER IF EXISTS {{prefix}}lanes_mark_update ON {{prefix}}lanes;

CREATE TRIGGER {{prefix}}lanes_mark_update
    AFTER UPDATE ON {{prefix}}lanes
    FOR EACH ROW WHEN (NEW.fencing_token > OLD.fencing_token)
    EXECUTE FUNCTION {{prefix}}lanes_mark();

DROP TRIGGER IF EXISTS {{prefix}}lanes_truncate ON {{prefix}}lanes;

CREATE TRIGGER {{prefix}}lanes_truncate
    BEFORE TRUNCATE ON {{prefix}}lanes
    FOR EACH STATEMENT EXECUTE FUNCTION {{prefix}}lanes_guard();

-- The configuration version of each lease name (scope): nodes learn of a
-- change by seeing it grow. It never goes back and is never deleted.
CREATE TABLE IF NOT EXISTS {{prefix}}config (
    scope          TEXT   PRIMARY KEY,
    config_version BIGINT NOT NULL CHECK (config_version >= 0),
    updated_at     BIGINT NOT NULL
);

CREATE OR REPLACE FUNCTION {{prefix}}config_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $guard$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'sqlfence: a config version may not be deleted' USING ERRCODE = 'SF006';
    END IF;
    IF NEW.scope <> OLD.scope OR NEW.config_version < OLD.config_version THEN
        RAISE EXCEPTION 'sqlfence: the config version of % may not go back from % to %',
            OLD.scope, OLD.config_version, NEW.config_version USING ERRCODE = 'SF006';
    END IF;
    RETURN NEW;
END
$guard$;

DROP TRIGGER IF EXISTS {{prefix}}config_guard ON {{prefix}}config;

CREATE TRIGGER {{prefix}}config_guard
    BEFORE UPDATE OR DELETE ON {{prefix}}config
    FOR EACH ROW EXECUTE FUNCTION {{prefix}}config_guard();

DROP TRIGGER IF EXISTS {{prefix}}config_truncate ON {{prefix}}config;

CREATE TRIGGER {{prefix}}config_truncate
    BEFORE TRUNCATE ON {{prefix}}config
    FOR EACH STATEMENT EXECUTE FUNCTION {{prefix}}config_guard();

-- The statement a handoff waits for, a follower's acquisition, is a
-- function so that PostgreSQL plans its statements once per database
-- session (plan_cache_mode = force_generic_plan, for the function's own
-- statements and the triggers they fire, as a SET clause restores the
-- session's own setting when the function returns). A statement sent with
-- parameters is planned again at each of its first five runs in a session
-- (a "custom plan", 0.2 to 0.5 ms for this one, ten times what running it
-- costs) and a follower that hears releases runs it rarely, when the
-- lease is free. Planned once, a session's later runs skip planning; the
-- followers' warm-up (query "warm") runs it once ahead, so the handoff
-- itself does not plan. It runs with the caller's rights and the pinned
-- search_path of the guards; EXECUTE is PUBLIC's by default. CREATE OR
-- REPLACE cannot change what a function returns: a later version that
-- does drops it first.

-- Grants a new term if the lease is free or expired, else reports the
-- holder: granted, holder, instance, token, expires, endpoint, now, and
-- whether this database session ran the warm-up (query "warm"). An attempt
-- on a lease that the statement's snapshot shows unexpired is refused on
-- that read alone: INSERT ... ON CONFLICT DO UPDATE would lock the row even
-- when its WHERE refuses the update (and fire the insert triggers first),
-- so every follower's attempt would wait for the leader's fenced
-- transactions and queue its renews. A release that commits after the
-- snapshot was taken is missed, as if the attempt had come just before it;
-- a follower woken by its NOTIFY starts after that commit and sees it.
-- A refused attempt commits without waiting for its WAL flush
-- (synchronous_commit off for its own transaction): its one write is the
-- membership heartbeat, which a server crash may lose at no cost, and
-- followers' attempts are most of a large cluster's statements (a fifth
-- less server CPU each, with pgbench). A grant waits for the flush, as
-- ever: the CASE sets nothing when the statement granted, and a grant
-- puts the setting back on for its transaction if it is off (a refused
-- attempt earlier in the same transaction, on a Pool whose connections
-- are transactions, would otherwise have turned it off for the grant too).
CREATE OR REPLACE FUNCTION {{prefix}}acquire(p_holder TEXT, p_instance TEXT, p_ttl_ms BIGINT, p_endpoint TEXT, p_name TEXT)
RETURNS TABLE (granted BOOLEAN, holder TEXT, instance TEXT, fencing_token BIGINT,
               expires_at BIGINT, endpoint TEXT, now_ms BIGINT, warm BOOLEAN)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $acquire$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH clock AS (
        SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms,
               COALESCE(current_setting('sqlfence.{{prefix}}warm', true), '') = '1' AS warm
    ), seen AS (
        -- The attempt is also this node's membership heartbeat: no extra
        -- statement.
        UPDATE {{prefix}}nodes SET last_seen = (SELECT now_ms FROM clock)
        WHERE scope = p_name AND instance = p_instance AND status = 'active'
    ), granted AS (
        INSERT INTO {{prefix}}lease AS l
            (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint)
        SELECT p_name, p_holder, p_instance,
               COALESCE((SELECT value FROM {{prefix}}high_water WHERE scope = 'lease/' || p_name), 0) + 1,
               now_ms, now_ms, now_ms + p_ttl_ms, p_endpoint
        FROM clock
        WHERE NOT EXISTS (SELECT 1 FROM {{prefix}}lease WHERE name = p_name AND expires_at > clock.now_ms)
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
    SELECT true, g.holder, g.instance, g.fencing_token, g.expires_at, g.endpoint, c.now_ms, c.warm
    FROM granted g, clock c
    WHERE current_setting('synchronous_commit') <> 'off' OR set_config('synchronous_commit', 'on', true) IS NOT NULL
    UNION ALL
    SELECT false, l.holder, l.instance, l.fencing_token, l.expires_at, l.endpoint, c.now_ms, c.warm
    FROM {{prefix}}lease l, clock c
    WHERE l.name = p_name AND NOT EXISTS (SELECT 1 FROM granted)
      AND CASE WHEN EXISTS (SELECT 1 FROM granted) THEN true
               ELSE set_config('synchronous_commit', 'off', true) IS NOT NULL END    ;
END
$acquire$;

