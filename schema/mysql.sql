-- sqlfence/cluster schema for MySQL 8.0 and MariaDB 10.5 or later (InnoDB),
-- version 3. {{prefix}} is replaced by Config.TablePrefix (validated,
-- default "cluster_"). Times are unix milliseconds by the database clock,
-- UTC_TIMESTAMP(6). A statement ends at a line that starts in column 0 and
-- ends with ";".
--
-- The file is idempotent and describes the whole current schema: New runs
-- it, under GET_LOCK, only when {{prefix}}schema_version records an older
-- version. MySQL DDL is not transactional and commits one statement at a
-- time, so triggers carry their schema version in their names (_v1): a
-- later version creates its own (an existing one, error 1359, is kept)
-- before it drops these, so that there is no moment without a guard, and
-- while it runs a write must pass both.
--
-- Guard errors are SIGNALed with SQLSTATEs of class SF, which the package
-- maps to its sentinel errors:
--   SF001 stale fencing token          SF002 chain tip moving backwards
--   SF003 chain tip deleted or renamed SF004 lease deleted or renamed
--   SF005 chain tip rewritten          SF006 fencing token lowered
--   SF007 fencing token below the high-water mark (a lease or lane row went
--         back)                      SF008 lane deleted or renamed
--   SF009 a lease or lane changing hands under the same fencing token
--
-- What MySQL cannot guard: TRUNCATE fires no trigger (it needs the DROP
-- privilege: withhold it from the application's role); the high-water mark
-- makes the next acquisition after a truncated lease table fail with SF007,
-- and New detects truncated chain tips. A TEMPORARY table hides a base table
-- of the same name from its own session, triggers included, so a role that
-- may CREATE TEMPORARY TABLES can fool the chain-tip guard from its own
-- session: withhold that privilege too (New warns when it is held).
-- With binary logging on, creating the triggers needs the TRIGGER privilege
-- and SUPER or log_bin_trust_function_creators=1.

CREATE TABLE IF NOT EXISTS {{prefix}}schema_version (
    version    INT    NOT NULL PRIMARY KEY,
    applied_at BIGINT NOT NULL
) ENGINE=InnoDB;

-- One row per lease name. The fencing token only ever grows: it is
-- incremented by every acquisition and kept by release and expiry.
CREATE TABLE IF NOT EXISTS {{prefix}}lease (
    name          VARCHAR(128)  NOT NULL PRIMARY KEY,
    holder        VARCHAR(255)  NOT NULL,
    instance      VARCHAR(64)   NOT NULL,
    fencing_token BIGINT        NOT NULL,
    acquired_at   BIGINT        NOT NULL,
    renewed_at    BIGINT        NOT NULL,
    expires_at    BIGINT        NOT NULL,
    endpoint      VARCHAR(2048) NOT NULL DEFAULT '',
    CONSTRAINT {{prefix}}lease_token_nonneg CHECK (fencing_token >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The highest fencing token ever granted per lease ('lease/<name>') and per
-- lane ('lane/...', see the lanes table), and the highest counter ever
-- recorded per chain tip ('chain/<name>').
CREATE TABLE IF NOT EXISTS {{prefix}}high_water (
    scope VARCHAR(300) NOT NULL PRIMARY KEY,
    value BIGINT       NOT NULL,
    CONSTRAINT {{prefix}}high_water_nonneg CHECK (value >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TRIGGER {{prefix}}high_water_update_v1
BEFORE UPDATE ON {{prefix}}high_water FOR EACH ROW
BEGIN
    IF BINARY NEW.scope <> BINARY OLD.scope OR NEW.value < OLD.value THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a high-water mark may not go back';
    END IF;
END;

CREATE TRIGGER {{prefix}}high_water_delete_v1
BEFORE DELETE ON {{prefix}}high_water FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a high-water mark may not be deleted';
END;

-- Fencing tokens must never go back or be granted twice. A row with token
-- 0 is a free lease never granted (the acquire statement creates one).
CREATE TRIGGER {{prefix}}lease_insert_v1
BEFORE INSERT ON {{prefix}}lease FOR EACH ROW
BEGIN
    DECLARE mark BIGINT DEFAULT NULL;
    IF NEW.fencing_token <> 0 THEN
        SELECT value INTO mark FROM {{prefix}}high_water WHERE scope = CONCAT('lease/', NEW.name);
        IF NEW.fencing_token < mark THEN
            SIGNAL SQLSTATE 'SF007' SET MESSAGE_TEXT = 'sqlfence: a fencing token below the high-water mark: the lease row went back';
        END IF;
        INSERT INTO {{prefix}}high_water (scope, value) VALUES (CONCAT('lease/', NEW.name), NEW.fencing_token)
            ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value));
    END IF;
END;

-- A term changes hands only with a new token (SF009).
CREATE TRIGGER {{prefix}}lease_update_v1
BEFORE UPDATE ON {{prefix}}lease FOR EACH ROW
BEGIN
    DECLARE mark BIGINT DEFAULT NULL;
    IF BINARY NEW.name <> BINARY OLD.name THEN
        SIGNAL SQLSTATE 'SF004' SET MESSAGE_TEXT = 'sqlfence: a lease may not be renamed';
    END IF;
    IF NEW.fencing_token = OLD.fencing_token
       AND (BINARY NEW.holder <> BINARY OLD.holder OR BINARY NEW.instance <> BINARY OLD.instance)
       AND NOT (NEW.holder = '' AND NEW.instance = ''
                AND NEW.expires_at <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) THEN
        SIGNAL SQLSTATE 'SF009' SET MESSAGE_TEXT = 'sqlfence: a lease may not change hands under the same fencing token: a new holder needs a new token';
    END IF;
    IF NEW.fencing_token < OLD.fencing_token THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a fencing token may not go back';
    END IF;
    IF NEW.fencing_token > OLD.fencing_token THEN
        SELECT value INTO mark FROM {{prefix}}high_water WHERE scope = CONCAT('lease/', NEW.name);
        IF NEW.fencing_token < mark THEN
            SIGNAL SQLSTATE 'SF007' SET MESSAGE_TEXT = 'sqlfence: a fencing token below the high-water mark: the lease row went back';
        END IF;
        INSERT INTO {{prefix}}high_water (scope, value) VALUES (CONCAT('lease/', NEW.name), NEW.fencing_token)
            ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value));
    END IF;
END;

CREATE TRIGGER {{prefix}}lease_delete_v1
BEFORE DELETE ON {{prefix}}lease FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE 'SF004' SET MESSAGE_TEXT = 'sqlfence: a lease may not be deleted: its fencing tokens would start again at 1';
END;

-- The recorded tip of each hash-chained table. The guards below make the
-- database itself refuse a tip written under a stale fencing token, moving
-- backwards, rewritten at the same counter, renamed or deleted.
CREATE TABLE IF NOT EXISTS {{prefix}}chain_tips (
    scope         VARCHAR(128)   NOT NULL PRIMARY KEY,
    lease_name    VARCHAR(128)   NOT NULL,
    at_counter    BIGINT         NOT NULL,
    row_hash      VARBINARY(512) NOT NULL,
    fencing_token BIGINT         NOT NULL,
    updated_at    BIGINT         NOT NULL,
    CONSTRAINT {{prefix}}chain_tips_counter_nonneg CHECK (at_counter >= 0),
    CONSTRAINT {{prefix}}chain_tips_token_pos CHECK (fencing_token > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT IGNORE INTO {{prefix}}high_water (scope, value)
SELECT CONCAT('chain/', scope), at_counter FROM {{prefix}}chain_tips;

CREATE TRIGGER {{prefix}}chain_tips_insert_v1
BEFORE INSERT ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    DECLARE cur_token BIGINT DEFAULT NULL;
    DECLARE cur_expires BIGINT DEFAULT NULL;
    DECLARE mark BIGINT DEFAULT NULL;
    -- A locking read holds the lease row until this transaction ends, so no
    -- later term can be granted before this tip commits.
    SELECT fencing_token, expires_at INTO cur_token, cur_expires
        FROM {{prefix}}lease WHERE name = NEW.lease_name LOCK IN SHARE MODE;
    IF cur_token IS NULL OR NEW.fencing_token <> cur_token
        OR cur_expires <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) THEN
        SIGNAL SQLSTATE 'SF001' SET MESSAGE_TEXT = 'sqlfence: stale fencing token';
    END IF;
    SELECT value INTO mark FROM {{prefix}}high_water WHERE scope = CONCAT('chain/', NEW.scope);
    IF NEW.at_counter < mark THEN
        SIGNAL SQLSTATE 'SF002' SET MESSAGE_TEXT = 'sqlfence: chain tip moving backwards';
    END IF;
    INSERT INTO {{prefix}}high_water (scope, value) VALUES (CONCAT('chain/', NEW.scope), NEW.at_counter)
        ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value));
END;

CREATE TRIGGER {{prefix}}chain_tips_update_v1
BEFORE UPDATE ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    DECLARE cur_token BIGINT DEFAULT NULL;
    DECLARE cur_expires BIGINT DEFAULT NULL;
    DECLARE mark BIGINT DEFAULT NULL;
    IF BINARY NEW.scope <> BINARY OLD.scope THEN
        SIGNAL SQLSTATE 'SF003' SET MESSAGE_TEXT = 'sqlfence: a chain tip may not be renamed';
    END IF;
    SELECT fencing_token, expires_at INTO cur_token, cur_expires
        FROM {{prefix}}lease WHERE name = NEW.lease_name LOCK IN SHARE MODE;
    IF cur_token IS NULL OR NEW.fencing_token <> cur_token OR NEW.fencing_token < OLD.fencing_token
        OR cur_expires <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) THEN
        SIGNAL SQLSTATE 'SF001' SET MESSAGE_TEXT = 'sqlfence: stale fencing token';
    END IF;
    SELECT value INTO mark FROM {{prefix}}high_water WHERE scope = CONCAT('chain/', NEW.scope);
    IF NEW.at_counter < OLD.at_counter OR NEW.at_counter < mark THEN
        SIGNAL SQLSTATE 'SF002' SET MESSAGE_TEXT = 'sqlfence: chain tip moving backwards';
    END IF;
    IF NEW.at_counter = OLD.at_counter AND NEW.row_hash <> OLD.row_hash THEN
        SIGNAL SQLSTATE 'SF005' SET MESSAGE_TEXT = 'sqlfence: a chain tip may not be rewritten with another hash';
    END IF;
    IF NEW.at_counter > OLD.at_counter THEN
        INSERT INTO {{prefix}}high_water (scope, value) VALUES (CONCAT('chain/', NEW.scope), NEW.at_counter)
            ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value));
    END IF;
END;

CREATE TRIGGER {{prefix}}chain_tips_delete_v1
BEFORE DELETE ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE 'SF003' SET MESSAGE_TEXT = 'sqlfence: chain tips may not be deleted';
END;

-- Cluster-wide facts every node must agree on, one row per lease name.
CREATE TABLE IF NOT EXISTS {{prefix}}state (
    scope            VARCHAR(128) NOT NULL PRIMARY KEY,
    vault_key_fp     VARCHAR(128) NOT NULL,
    rotation_epoch   BIGINT       NOT NULL DEFAULT 0,
    recorded_at      BIGINT       NOT NULL,
    recorded_by_node VARCHAR(255) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Membership: one row per node process (instance) and lease name, written
-- at start, refreshed every few heartbeats, marked 'left' on Shutdown.
-- Liveness is judged from last_seen by the database clock; which member
-- leads, from the lease row.
CREATE TABLE IF NOT EXISTS {{prefix}}nodes (
    scope      VARCHAR(128)  NOT NULL,
    instance   VARCHAR(64)   NOT NULL,
    node_id    VARCHAR(255)  NOT NULL,
    host       VARCHAR(255)  NOT NULL,
    pid        BIGINT        NOT NULL,
    endpoint   VARCHAR(2048) NOT NULL DEFAULT '',
    started_at BIGINT        NOT NULL,
    last_seen  BIGINT        NOT NULL,
    status     VARCHAR(8)    NOT NULL,
    -- 1 once the node claimed a lane: it counts towards the lanes' fair share.
    takes_lanes TINYINT      NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, instance),
    CONSTRAINT {{prefix}}nodes_status CHECK (status IN ('active', 'left'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Version 2: every member records its node timeout (its LeaseTTL and three
-- heartbeats, in ms), by which its own liveness is judged, so every reader
-- (Members, MembersHandler, clusterctl) agrees; 0 in a row written before.
-- MySQL 8 has no ADD COLUMN IF NOT EXISTS: New takes error 1060
-- (duplicate column name) for the column being there already.
ALTER TABLE {{prefix}}nodes ADD COLUMN timeout_ms BIGINT NOT NULL DEFAULT 0;

-- Lanes: partitioned work. One row per lane key of a lease name (scope),
-- naming the node process (instance) that owns the lane until expires_at,
-- by the database clock, under a fencing token of the lane's own: it grows
-- with every new claim and is kept by renewal, release and expiry. A row
-- with token 0 is a lane never claimed. Rows are never deleted, so a key
-- claimed again continues from its token; the highest token each lane was
-- granted is kept in high_water under 'lane/<length of scope>/<scope>/<lane>'
-- (the length keeps two scope and lane pairs from sharing a mark). TRUNCATE
-- cannot be trapped: the next claim of a truncated lane starts again at 1,
-- below its mark, and fails with SF007.
CREATE TABLE IF NOT EXISTS {{prefix}}lanes (
    scope         VARCHAR(128) NOT NULL,
    lane          VARCHAR(128) NOT NULL,
    holder        VARCHAR(255) NOT NULL,
    instance      VARCHAR(64)  NOT NULL,
    fencing_token BIGINT       NOT NULL,
    acquired_at   BIGINT       NOT NULL,
    renewed_at    BIGINT       NOT NULL,
    expires_at    BIGINT       NOT NULL,
    PRIMARY KEY (scope, lane),
    -- What a claim and a keeper's heartbeat count reads only the lanes
    -- held now or within the fair share's window, however many keys the
    -- scope ever used (rows are never deleted).
    KEY {{prefix}}lanes_by_holding (scope, instance, expires_at),
    KEY {{prefix}}lanes_by_renewal (scope, renewed_at),
    CONSTRAINT {{prefix}}lanes_token_nonneg CHECK (fencing_token >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TRIGGER {{prefix}}lanes_insert_v1
BEFORE INSERT ON {{prefix}}lanes FOR EACH ROW
BEGIN
    DECLARE mark BIGINT DEFAULT NULL;
    IF NEW.fencing_token <> 0 THEN
        SELECT value INTO mark FROM {{prefix}}high_water
            WHERE scope = CONCAT('lane/', CHAR_LENGTH(NEW.scope), '/', NEW.scope, '/', NEW.lane);
        IF NEW.fencing_token < mark THEN
            SIGNAL SQLSTATE 'SF007' SET MESSAGE_TEXT = 'sqlfence: a lane fencing token below the high-water mark: the lane row went back';
        END IF;
        INSERT INTO {{prefix}}high_water (scope, value)
            VALUES (CONCAT('lane/', CHAR_LENGTH(NEW.scope), '/', NEW.scope, '/', NEW.lane), NEW.fencing_token)
            ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value));
    END IF;
END;

-- A term changes hands only with a new token (SF009).
CREATE TRIGGER {{prefix}}lanes_update_v1
BEFORE UPDATE ON {{prefix}}lanes FOR EACH ROW
BEGIN
    DECLARE mark BIGINT DEFAULT NULL;
    IF BINARY NEW.scope <> BINARY OLD.scope OR BINARY NEW.lane <> BINARY OLD.lane THEN
        SIGNAL SQLSTATE 'SF008' SET MESSAGE_TEXT = 'sqlfence: a lane may not be renamed';
    END IF;
    IF NEW.fencing_token = OLD.fencing_token
       AND (BINARY NEW.holder <> BINARY OLD.holder OR BINARY NEW.instance <> BINARY OLD.instance) THEN
        SIGNAL SQLSTATE 'SF009' SET MESSAGE_TEXT = 'sqlfence: a lane may not change hands under the same fencing token: a new holder needs a new token';
    END IF;
    IF NEW.fencing_token < OLD.fencing_token THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a lane fencing token may not go back';
    END IF;
    IF NEW.fencing_token > OLD.fencing_token THEN
        SELECT value INTO mark FROM {{prefix}}high_water
            WHERE scope = CONCAT('lane/', CHAR_LENGTH(NEW.scope), '/', NEW.scope, '/', NEW.lane);
        IF NEW.fencing_token < mark THEN
            SIGNAL SQLSTATE 'SF007' SET MESSAGE_TEXT = 'sqlfence: a lane fencing token below the high-water mark: the lane row went back';
        END IF;
        INSERT INTO {{prefix}}high_water (scope, value)
            VALUES (CONCAT('lane/', CHAR_LENGTH(NEW.scope), '/', NEW.scope, '/', NEW.lane), NEW.fencing_token)
            ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value));
    END IF;
END;

CREATE TRIGGER {{prefix}}lanes_delete_v1
BEFORE DELETE ON {{prefix}}lanes FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE 'SF008' SET MESSAGE_TEXT = 'sqlfence: a lane may not be deleted: its fencing tokens would start again at 1';
END;

-- The configuration version of each lease name (scope): nodes learn of a
-- change by seeing it grow. It never goes back and is never deleted.
CREATE TABLE IF NOT EXISTS {{prefix}}config (
    scope          VARCHAR(128) NOT NULL PRIMARY KEY,
    config_version BIGINT       NOT NULL,
    updated_at     BIGINT       NOT NULL,
    CONSTRAINT {{prefix}}config_version_nonneg CHECK (config_version >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TRIGGER {{prefix}}config_update_v1
BEFORE UPDATE ON {{prefix}}config FOR EACH ROW
BEGIN
    IF BINARY NEW.scope <> BINARY OLD.scope OR NEW.config_version < OLD.config_version THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a config version may not go back';
    END IF;
END;

CREATE TRIGGER {{prefix}}config_delete_v1
BEFORE DELETE ON {{prefix}}config FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a config version may not be deleted';
END;

-- Version 3: no NULL slips past the guards. Under UPDATE IGNORE, or in a
-- session without a strict sql_mode, a NULL assigned to a NOT NULL column
-- reaches the BEFORE triggers as NULL, where every comparison with it is
-- unknown and no guard fires, and is then stored as 0: a fencing token or
-- a high-water mark lowered to 0, or a lease handed over under token 0.
-- These triggers run first (PRECEDES) and refuse any NULL in a column the
-- guards read. SIGNAL is an error that IGNORE does not downgrade. A chain
-- tip also keeps its lease: a tip moved to another lease row, one the
-- application's role may insert with any token, would be written under a
-- token no real term holds.
CREATE TRIGGER {{prefix}}lease_ins_null_v3
BEFORE INSERT ON {{prefix}}lease FOR EACH ROW PRECEDES {{prefix}}lease_insert_v1
BEGIN
    IF NEW.name IS NULL OR NEW.holder IS NULL OR NEW.instance IS NULL OR NEW.fencing_token IS NULL
       OR NEW.expires_at IS NULL THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a lease column the guards read may not be NULL (it would be stored as 0)';
    END IF;
END;

CREATE TRIGGER {{prefix}}lease_upd_null_v3
BEFORE UPDATE ON {{prefix}}lease FOR EACH ROW PRECEDES {{prefix}}lease_update_v1
BEGIN
    IF NEW.name IS NULL OR NEW.holder IS NULL OR NEW.instance IS NULL OR NEW.fencing_token IS NULL
       OR NEW.expires_at IS NULL THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a lease column the guards read may not be NULL (it would be stored as 0)';
    END IF;
END;

CREATE TRIGGER {{prefix}}high_water_ins_null_v3
BEFORE INSERT ON {{prefix}}high_water FOR EACH ROW
BEGIN
    IF NEW.scope IS NULL OR NEW.value IS NULL THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a high-water mark may not be NULL (it would be stored as 0)';
    END IF;
END;

CREATE TRIGGER {{prefix}}high_water_upd_null_v3
BEFORE UPDATE ON {{prefix}}high_water FOR EACH ROW PRECEDES {{prefix}}high_water_update_v1
BEGIN
    IF NEW.scope IS NULL OR NEW.value IS NULL THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a high-water mark may not be NULL (it would be stored as 0)';
    END IF;
END;

CREATE TRIGGER {{prefix}}chain_tips_ins_null_v3
BEFORE INSERT ON {{prefix}}chain_tips FOR EACH ROW PRECEDES {{prefix}}chain_tips_insert_v1
BEGIN
    IF NEW.scope IS NULL OR NEW.lease_name IS NULL OR NEW.at_counter IS NULL OR NEW.row_hash IS NULL
       OR NEW.fencing_token IS NULL THEN
        SIGNAL SQLSTATE 'SF001' SET MESSAGE_TEXT = 'sqlfence: stale fencing token: a chain tip column the guards read may not be NULL';
    END IF;
END;

CREATE TRIGGER {{prefix}}chain_tips_upd_null_v3
BEFORE UPDATE ON {{prefix}}chain_tips FOR EACH ROW PRECEDES {{prefix}}chain_tips_update_v1
BEGIN
    IF NEW.scope IS NULL OR NEW.lease_name IS NULL OR NEW.at_counter IS NULL OR NEW.row_hash IS NULL
       OR NEW.fencing_token IS NULL THEN
        SIGNAL SQLSTATE 'SF001' SET MESSAGE_TEXT = 'sqlfence: stale fencing token: a chain tip column the guards read may not be NULL';
    END IF;
    IF BINARY NEW.lease_name <> BINARY OLD.lease_name THEN
        SIGNAL SQLSTATE 'SF003' SET MESSAGE_TEXT = 'sqlfence: a chain tip may not move to another lease';
    END IF;
END;

CREATE TRIGGER {{prefix}}lanes_ins_null_v3
BEFORE INSERT ON {{prefix}}lanes FOR EACH ROW PRECEDES {{prefix}}lanes_insert_v1
BEGIN
    IF NEW.scope IS NULL OR NEW.lane IS NULL OR NEW.holder IS NULL OR NEW.instance IS NULL
       OR NEW.fencing_token IS NULL THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a lane column the guards read may not be NULL (it would be stored as 0)';
    END IF;
END;

CREATE TRIGGER {{prefix}}lanes_upd_null_v3
BEFORE UPDATE ON {{prefix}}lanes FOR EACH ROW PRECEDES {{prefix}}lanes_update_v1
BEGIN
    IF NEW.scope IS NULL OR NEW.lane IS NULL OR NEW.holder IS NULL OR NEW.instance IS NULL
       OR NEW.fencing_token IS NULL THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a lane column the guards read may not be NULL (it would be stored as 0)';
    END IF;
END;

CREATE TRIGGER {{prefix}}config_ins_null_v3
BEFORE INSERT ON {{prefix}}config FOR EACH ROW
BEGIN
    IF NEW.scope IS NULL OR NEW.config_version IS NULL THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a config version may not be NULL (it would be stored as 0)';
    END IF;
END;

CREATE TRIGGER {{prefix}}config_upd_null_v3
BEFORE UPDATE ON {{prefix}}config FOR EACH ROW PRECEDES {{prefix}}config_update_v1
BEGIN
    IF NEW.scope IS NULL OR NEW.config_version IS NULL THEN
        SIGNAL SQLSTATE 'SF006' SET MESSAGE_TEXT = 'sqlfence: a config version may not be NULL (it would be stored as 0)';
    END IF;
END;
