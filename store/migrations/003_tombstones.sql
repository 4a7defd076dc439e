-- Tombstones: one row per deleted job, holding the delete's version, so that
-- no later event at or below it brings the job back. A job has a row in the
-- read model or a tombstone, never both: a snapshot above the tombstone
-- creates the job again and removes the tombstone. Tombstones older than
-- --tombstone-retention are pruned.

CREATE TABLE IF NOT EXISTS {{schema}}.projector_tombstones (
    projection       text        NOT NULL,
    job_id           text        NOT NULL,
    version          bigint      NOT NULL CHECK (version >= 1),
    deleted_at       timestamptz NOT NULL DEFAULT now(),
    event_id         text,
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    PRIMARY KEY (projection, job_id)
);
CREATE INDEX IF NOT EXISTS projector_tombstones_by_age
    ON {{schema}}.projector_tombstones (projection, deleted_at);
