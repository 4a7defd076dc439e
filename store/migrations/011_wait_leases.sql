-- Who waits on the projection's channel. Every process that serves waits
-- (a /wait listener, the Go package wait) holds a row here while it runs,
-- renewed well before expires_at; a batch is announced on the channel
-- (pg_notify) only while a row is live, or when the instance was started
-- with --notify. NOTIFY serializes committing transactions on a lock of
-- the whole server, so a projection nobody waits on should not pay for
-- it; and since the check is made inside each batch's transaction, every
-- instance notifies as soon as any one of them serves waits, whatever
-- its own flags. holder tells the processes apart (host, process id and a
-- random suffix); a stopping waiter deletes its row, and an expired row
-- is deleted by the next renewal of any holder.
CREATE TABLE IF NOT EXISTS {{schema}}.projector_wait_leases (
    projection text        NOT NULL,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (projection, holder)
);
