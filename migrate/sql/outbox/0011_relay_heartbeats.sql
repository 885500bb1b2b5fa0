-- compat: expand: a new table; older binaries neither read nor write it.
-- Relays' heartbeats: one row per relay id, so that an operator tells "no relay
-- running" from "relays idle" (pgoutbox status, the console's relays page). A relay
-- writes its row at start, every heartbeat interval (the relays of one database in
-- one statement, so the cost grows with databases, not with tenants) and, with
-- state 'stopped', when it stops. A relay that dies writes nothing more: its
-- last_seen ages. cleanup deletes rows older than its retention.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_relays (
    relay_id   text        PRIMARY KEY CHECK (octet_length(relay_id) BETWEEN 1 AND 200),
    source     text        NOT NULL CHECK (source IN ('poll', 'cdc')),
    version    text        NOT NULL CHECK (octet_length(version) <= 200),
    host       text        NOT NULL CHECK (octet_length(host) <= 255),
    pid        integer     NOT NULL,
    state      text        NOT NULL CHECK (state IN ('busy', 'idle', 'stopped')),
    beat_every interval    NOT NULL,  -- the relay's heartbeat interval: silent for three, it is gone
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL
);
