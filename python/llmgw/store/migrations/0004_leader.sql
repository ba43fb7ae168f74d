-- The control planes' leader lease (PostgreSQL: several control planes share one store; on
-- SQLite there is one control plane and the table stays empty). One row per lease name;
-- the holder renews it before expires_at, and anyone may take it once expires_at has
-- passed. Times are unix seconds of the DATABASE's clock (store/leader.py), so the
-- control planes' own clocks never decide who leads.
CREATE TABLE leader_lease (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    admin_url TEXT NOT NULL,
    agent_address TEXT NOT NULL,
    since DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
