-- A held delta records the coordinates of the record it came from: a
-- re-read may find it in another partition than the one whose owner holds
-- it (partition), and a later rejection quarantines it under its own
-- partition and offset. log_time is the record's broker timestamp, from
-- which the re-read window is measured. Rows held before this migration
-- came from their holder's partition.
ALTER TABLE {{schema}}.projector_held
    ADD COLUMN IF NOT EXISTS source_partition integer,
    ADD COLUMN IF NOT EXISTS log_time timestamptz;
UPDATE {{schema}}.projector_held SET source_partition = partition WHERE source_partition IS NULL;
