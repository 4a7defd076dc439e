-- The gap log: one row per closed gap, for `projector explain`, bounded by age
-- and rows (pruned in small batches by `projector run`). And, on each held
-- delta, the gap attempts that left it held.

CREATE TABLE IF NOT EXISTS {{schema}}.projector_gap_log (
    id            bigserial   PRIMARY KEY,
    projection    text        NOT NULL,
    job_id        text        NOT NULL,
    opened_at     timestamptz NOT NULL,
    closed_at     timestamptz NOT NULL DEFAULT now(),
    -- what closed it: wait, reread, snapshot, or verify (a repair)
    step          text        NOT NULL,
    from_version  bigint      NOT NULL,
    to_version    bigint      NOT NULL,
    held_versions bigint[]    NOT NULL DEFAULT '{}',
    attempts      integer     NOT NULL DEFAULT 0,
    topic         text        NOT NULL DEFAULT '',
    partition     integer
);
CREATE INDEX IF NOT EXISTS projector_gap_log_by_job
    ON {{schema}}.projector_gap_log (projection, job_id, id);
CREATE INDEX IF NOT EXISTS projector_gap_log_by_time
    ON {{schema}}.projector_gap_log (projection, closed_at);

ALTER TABLE {{schema}}.projector_held
    ADD COLUMN IF NOT EXISTS attempts        integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS last_step       text        NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS last_error      text        NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS last_attempt_at timestamptz;
