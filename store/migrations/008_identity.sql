-- What a projection is and where it reads from. id tells projections
-- apart wherever they meet outside this database (a Kafka consumer
-- group's members carry it); kafka_group and sqs_queue are the consumer
-- group and the queue its instances use, recorded by the first instance
-- that ran, so every later one joins the same.
CREATE TABLE IF NOT EXISTS {{schema}}.projector_identity (
    projection  text        PRIMARY KEY,
    id          uuid        NOT NULL DEFAULT gen_random_uuid(),
    kafka_group text,
    sqs_queue   text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
