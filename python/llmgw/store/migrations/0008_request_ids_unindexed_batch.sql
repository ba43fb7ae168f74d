-- The id rows lose their index by batch. Every final stored wrote two b-tree entries (the id
-- and the batch index), and the second was read only by retention, hourly. Retention now
-- finds a post's ids in its stored text and deletes them by id (store/usage.py, `prune`),
-- which takes about a fifth off the SQLite thread's time per stored request.
DROP INDEX IF EXISTS request_ids_batch;
