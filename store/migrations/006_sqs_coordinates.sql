-- Records read from an SQS queue have no partition and offset: they are
-- named by their message id and, on a FIFO queue, their sequence number
-- (128 bits, kept as text). Held and quarantined SQS records keep both;
-- their "offset" is the sequence number modulo 2^63 (or a hash of the
-- message id), which keeps the existing keys unique. Kafka rows leave the
-- columns null.
ALTER TABLE {{schema}}.projector_quarantine
    ADD COLUMN IF NOT EXISTS message_id      text,
    ADD COLUMN IF NOT EXISTS sequence_number text;
ALTER TABLE {{schema}}.projector_held
    ADD COLUMN IF NOT EXISTS message_id      text,
    ADD COLUMN IF NOT EXISTS sequence_number text;
