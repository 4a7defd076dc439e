-- The read model, positions with fencing epochs, held deltas and the quarantine.
-- {{schema}} and {{jobs}} are replaced by quoted identifiers before running.

CREATE TABLE IF NOT EXISTS {{schema}}.{{jobs}} (
    job_id           text        PRIMARY KEY,
    version          bigint      NOT NULL CHECK (version >= 1),
    state            jsonb       NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    event_id         text,
    -- the ops of the delta that made this version (null when a snapshot
    -- did): a different delta at the same version is a conflict
    last_ops         jsonb
);

CREATE TABLE IF NOT EXISTS {{schema}}.projector_partitions (
    projection  text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL DEFAULT -1,
    epoch       bigint      NOT NULL DEFAULT 0,
    owner       text        NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, topic, partition)
);

CREATE TABLE IF NOT EXISTS {{schema}}.projector_quarantine (
    id          bigserial   PRIMARY KEY,
    projection  text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    key         bytea,
    value       bytea,
    error       text        NOT NULL,
    "time"      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (projection, topic, partition, "offset")
);

CREATE TABLE IF NOT EXISTS {{schema}}.projector_held (
    projection  text        NOT NULL,
    job_id      text        NOT NULL,
    version     bigint      NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    ops         jsonb       NOT NULL,
    event_id    text        NOT NULL DEFAULT '',
    held_since  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, job_id, version)
);
CREATE INDEX IF NOT EXISTS projector_held_by_partition
    ON {{schema}}.projector_held (projection, topic, partition);
