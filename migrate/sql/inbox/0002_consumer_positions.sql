-- compat: contract: consumers that do not keep positions would let ordered consumers of the same aggregate apply events out of order.
-- Per-aggregate positions of each consumer: the highest aggregate_sequence the
-- consumer has applied (or an operator declared done, see inbox.Consumer.SetPosition).
-- A consumer locks its row for the aggregate in the same transaction as its
-- processed_events row and the business effect, so consumers of one aggregate queue
-- up behind each other and the position moves only when the effect commits.
--
-- Rows are never deleted by retention: a consumer whose position disappeared would
-- take the aggregate's next event for a gap (sequence > 1 after "nothing applied").
CREATE TABLE IF NOT EXISTS {{schema}}.consumer_positions (
    consumer_name  text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    last_sequence  bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT consumer_positions_pkey PRIMARY KEY (consumer_name, aggregate_type, aggregate_id),
    CONSTRAINT consumer_positions_consumer_name_check CHECK (consumer_name <> ''),
    CONSTRAINT consumer_positions_last_sequence_check CHECK (last_sequence >= 0)
) WITH (fillfactor = 80);
