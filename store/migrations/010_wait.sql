-- Waits for any client of the database: projector_wait_job returns true
-- once the projection's row of job_id is at version or above, or the job
-- is deleted at or above it; projector_wait_position once the stored
-- position of a partition has passed an offset; false when timeout_ms
-- ends first. A function cannot LISTEN and receive notifications inside
-- one statement, so these poll (every 5 ms at first, then at most every
-- 100 ms) until the timeout: they hold their caller's connection all the
-- while, by nature. Call them outside a transaction, or in a READ
-- COMMITTED one (a REPEATABLE READ snapshot never sees the write), with a
-- statement_timeout above timeout_ms. Services with many waiters use the
-- Go package wait or GET /wait instead, which hold no connection while
-- they sleep.
CREATE OR REPLACE FUNCTION {{schema}}.projector_wait_job(projection text, job_id text, version bigint, timeout_ms integer)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => least(greatest(timeout_ms, 0), 60000) / 1000.0);
    pause    float8 := 0.005;
    at       bigint;
BEGIN
    LOOP
        EXECUTE 'SELECT coalesce((SELECT j.version FROM {{schema}}.' || quote_ident(projection) || ' j WHERE j.job_id = $1),
                (SELECT t.version FROM {{schema}}.projector_tombstones t WHERE t.projection = $2 AND t.job_id = $1), 0)'
            INTO at USING job_id, projection;
        IF at >= version THEN
            RETURN true;
        END IF;
        EXIT WHEN clock_timestamp() >= deadline;
        PERFORM pg_sleep(least(pause, greatest(extract(epoch FROM deadline - clock_timestamp()), 0)));
        pause := least(pause * 2, 0.1);
    END LOOP;
    RETURN false;
END
$fn$;

CREATE OR REPLACE FUNCTION {{schema}}.projector_wait_position(projection text, topic text, part integer, after_offset bigint, timeout_ms integer)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => least(greatest(timeout_ms, 0), 60000) / 1000.0);
    pause    float8 := 0.005;
    at       bigint;
BEGIN
    LOOP
        SELECT p.next_offset INTO at FROM {{schema}}.projector_partitions p
            WHERE p.projection = projector_wait_position.projection AND p.topic = projector_wait_position.topic
                AND p.partition = part;
        IF at > after_offset THEN
            RETURN true;
        END IF;
        EXIT WHEN clock_timestamp() >= deadline;
        PERFORM pg_sleep(least(pause, greatest(extract(epoch FROM deadline - clock_timestamp()), 0)));
        pause := least(pause * 2, 0.1);
    END LOOP;
    RETURN false;
END
$fn$;
