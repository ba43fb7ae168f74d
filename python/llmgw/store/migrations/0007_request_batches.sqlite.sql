-- SQLite's copy of 0007_request_batches.sql: INTEGER PRIMARY KEY (the rowid) for the batch id,
-- and the id rows WITHOUT ROWID (one b-tree, keyed by the id).
-- Finished requests stored as their gateway posted them: one row per posted batch, holding
-- its final records (JSON arrays of wire.UsageRow without bodies; bodies stay in
-- request_bodies), and one narrow row per request naming its batch. A 25-column row per
-- request cost the control plane most of its ingest (3.2 us a request in SQLite, where
-- the id row costs about 1); reads by id decode one batch, which admin lookups can afford.
-- `requests` keeps interrupted requests (settled from opens) and the finals written before
-- this migration; a final that arrives for an interrupted request replaces its row there.
CREATE TABLE request_batches (
    id INTEGER PRIMARY KEY,
    gateway_id TEXT NOT NULL,
    received_at DOUBLE PRECISION NOT NULL,
    -- The latest started_at in the batch: retention drops a batch once all of it is past.
    started_max DOUBLE PRECISION NOT NULL,
    rows TEXT NOT NULL
);

CREATE INDEX request_batches_started_max ON request_batches (started_max);

CREATE TABLE request_ids (
    id TEXT PRIMARY KEY,
    batch BIGINT NOT NULL
) WITHOUT ROWID;

-- Retention deletes a batch's ids with it.
CREATE INDEX request_ids_batch ON request_ids (batch);
