-- The leader lease's fencing epoch (store/leader.py): one more at every change of holder
-- (or a holder taking its own lease again after it had expired), so the writes of a
-- deposed leader that has not noticed yet (paused, partitioned) can be told from the
-- current leader's and refused. Existing rows start at 0; the next take moves it on.
ALTER TABLE leader_lease ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
