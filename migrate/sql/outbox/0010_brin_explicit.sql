-- compat: expand: an index storage parameter; no binary reads it.
-- The BRIN index on published_at (migration 3) no longer asks autovacuum to
-- summarize each range as it fills (autosummarize = off). With it on, every new
-- range of 16 pages queued a work item in autovacuum's server-wide queue of 256;
-- a sustained enqueue filled it, and then PostgreSQL logged "request for BRIN range
-- summarization for index ... was not recorded" for each further range, and the
-- work items of other tables' BRIN indexes were dropped.
--
-- Summarization stays explicit and bounded instead: each cleanup run (admin.Cleanup,
-- the relay's Cleaner, "pgoutbox cleanup") summarizes at most
-- CleanupConfig.SummarizeRanges of the newest unsummarized ranges, and every VACUUM
-- of the table (autovacuum's included) summarizes the rest. Until then a range is
-- read in full by the queries that use the index, which is what the tail of the
-- table costs anyway (docs/operations.md, "Cleanup").
--
-- A partitioned outbox's index is a partitioned index, whose storage parameters
-- cannot be altered: it is made again without autosummarize (BRIN builds read the
-- table once; the partitions made later take the new definition).
DO $brin$
BEGIN
    IF (SELECT c.relkind FROM pg_catalog.pg_class c
         WHERE c.oid = pg_catalog.to_regclass(pg_catalog.format('%I.%I', {{schema_name}}, 'outbox_events_published_at_brin'))) = 'I' THEN
        DROP INDEX IF EXISTS {{schema}}.outbox_events_published_at_brin;
        CREATE INDEX IF NOT EXISTS outbox_events_published_at_brin
            ON {{schema}}.outbox_events USING brin (published_at)
            WITH (pages_per_range = 16, autosummarize = off);
    ELSE
        ALTER INDEX {{schema}}.outbox_events_published_at_brin SET (autosummarize = off);
    END IF;
END
$brin$;
