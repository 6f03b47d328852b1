-- sqlfence/cluster schema for SQLite 3.42 or later.
-- {{prefix}} is replaced by Config.TablePrefix (validated, default "cluster_").
-- Times are unix milliseconds by the clock of the host that writes them.
-- A statement ends at a line that starts in column 0 and ends with ";".

CREATE TABLE IF NOT EXISTS {{prefix}}schema_version (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
);

-- One row per lease name. The fencing token only ever grows: it is
-- incremented by every acquisition and kept by release and expiry.
-- Never delete a row: that would restart its tokens at 1.
CREATE TABLE IF NOT EXISTS {{prefix}}lease (
    name          TEXT    NOT NULL PRIMARY KEY,
    holder        TEXT    NOT NULL,
    instance      TEXT    NOT NULL,
    fencing_token INTEGER NOT NULL CHECK (fencing_token >= 0),
    acquired_at   INTEGER NOT NULL,
    renewed_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    endpoint      TEXT    NOT NULL DEFAULT ''
);
