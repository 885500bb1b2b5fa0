-- compat: expand: a new table; nothing before it used the inbox line.
-- The consumer inbox: one row per (consumer, event) applied. A consumer inserts its row
-- in the same transaction as the business effect; ON CONFLICT DO NOTHING tells a
-- duplicate delivery apart from a first one.
CREATE TABLE IF NOT EXISTS {{schema}}.processed_events (
    consumer_name text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT processed_events_pkey PRIMARY KEY (consumer_name, event_id),
    CONSTRAINT processed_events_consumer_name_check CHECK (consumer_name <> '')
);

-- Retention deletes the oldest rows in bounded batches.
CREATE INDEX IF NOT EXISTS processed_events_processed_at_idx
    ON {{schema}}.processed_events (processed_at);
