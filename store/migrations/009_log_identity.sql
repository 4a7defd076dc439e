-- What tells a partition's log from a new one of the same name (a topic
-- deleted and recreated): the offset and a hash of the last record a
-- batch read (last_offset, last_hash), checked against the log when a
-- partition is claimed. log_resets counts the times a new log was found
-- and read from its start; the quarantined records of each log replaced
-- keep their rows under the topic name "<topic>~log<n>", so a record of
-- the new log at the same offset is quarantined too, never taken for one
-- of them.
ALTER TABLE {{schema}}.projector_partitions
    ADD COLUMN IF NOT EXISTS last_offset bigint,
    ADD COLUMN IF NOT EXISTS last_hash   bigint,
    ADD COLUMN IF NOT EXISTS log_resets  integer NOT NULL DEFAULT 0;
