-- sqlfence/cluster schema for PostgreSQL 12 or later.
-- {{prefix}} is replaced by Config.TablePrefix (validated, default "cluster_").
-- Times are unix milliseconds by the database clock, clock_timestamp().
-- A statement ends at a line that starts in column 0 and ends with ";".

CREATE TABLE IF NOT EXISTS {{prefix}}schema_version (
    version    INTEGER PRIMARY KEY,
    applied_at BIGINT  NOT NULL
);

-- One row per lease name. The fencing token only ever grows: it is
-- incremented by every acquisition and kept by release and expiry.
-- Never delete a row: that would restart its tokens at 1.
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
