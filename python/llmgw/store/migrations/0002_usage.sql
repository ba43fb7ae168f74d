-- Usage: one row per request, its kept bodies, the hourly rollup, the gateways heard from.
-- Ids of orgs, teams, projects, users and keys are plain TEXT on purpose, with no
-- foreign key: usage must outlive a deleted key or project (billing looks back).

-- A finished request: state final (the gateway's record arrived) or interrupted (its
-- gateway went silent first; tokens are the open's prompt estimate, until a late final
-- corrects it); requests still running are in open_batches. What a row adds to the
-- rollups is a function of the row alone (see store/usage.py), so every change of state
-- moves them by the difference, once.
CREATE TABLE requests (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    gateway_id TEXT NOT NULL,
    org_id TEXT,
    team_id TEXT,
    project_id TEXT,
    user_id TEXT,
    key_id TEXT,
    model TEXT NOT NULL,
    upstream_model TEXT,
    replica TEXT,
    route TEXT,
    retries BIGINT NOT NULL DEFAULT 0,
    stream INTEGER NOT NULL DEFAULT 0,
    started_at DOUBLE PRECISION NOT NULL,
    ttft_ms DOUBLE PRECISION,
    duration_ms DOUBLE PRECISION,
    status TEXT,
    http_status BIGINT,
    prompt_estimate BIGINT NOT NULL DEFAULT 0,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    usage_estimated INTEGER NOT NULL DEFAULT 0,
    finish_reason TEXT,
    body_kept INTEGER NOT NULL DEFAULT 0,
    updated_at DOUBLE PRECISION NOT NULL
);

-- Retention deletes by age.
CREATE INDEX requests_started_at ON requests (started_at);

-- Requests forwarded and not finished, one row per batch that announced them, not per
-- request: most finish within seconds, and a row per request cost an insert, a delete and
-- the vacuum of both (it halved PostgreSQL's ingestion rate and bloated as it ran).
-- Settling reads a silent gateway's rows; compaction drops the requests that finished.
-- opens: a JSON list of wire.UsageOpen.
CREATE TABLE open_batches (
    id TEXT PRIMARY KEY,
    gateway_id TEXT NOT NULL,
    received_at DOUBLE PRECISION NOT NULL,
    opens TEXT NOT NULL
);

CREATE INDEX open_batches_gateway ON open_batches (gateway_id);
CREATE INDEX open_batches_received_at ON open_batches (received_at);

-- Bodies are kept only where the project asks for it and the request did not say no_store.
-- request: the JSON the client sent; response: the answer as text (SSE frames for a stream).
CREATE TABLE request_bodies (
    request_id TEXT PRIMARY KEY,
    request TEXT,
    response TEXT
);

-- hour: the unix second an hour starts at (UTC), an integer so that day buckets are
-- `hour - hour % 86400` on both backends. Missing dimensions are '' (never NULL),
-- because NULLs are distinct in a primary key and would split one group into many.
CREATE TABLE usage_hourly (
    hour BIGINT NOT NULL,
    org_id TEXT NOT NULL DEFAULT '',
    team_id TEXT NOT NULL DEFAULT '',
    project_id TEXT NOT NULL DEFAULT '',
    user_id TEXT NOT NULL DEFAULT '',
    key_id TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '',
    requests BIGINT NOT NULL DEFAULT 0,
    errors BIGINT NOT NULL DEFAULT 0,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, org_id, team_id, project_id, user_id, key_id, model)
);

-- The same per UTC day (day: the unix second it starts at), kept in the same transaction as
-- usage_hourly, so that a month's export reads 30 rows per group instead of 720.
CREATE TABLE usage_daily (
    day BIGINT NOT NULL,
    org_id TEXT NOT NULL DEFAULT '',
    team_id TEXT NOT NULL DEFAULT '',
    project_id TEXT NOT NULL DEFAULT '',
    user_id TEXT NOT NULL DEFAULT '',
    key_id TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '',
    requests BIGINT NOT NULL DEFAULT 0,
    errors BIGINT NOT NULL DEFAULT 0,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (day, org_id, team_id, project_id, user_id, key_id, model)
);

-- Every gateway worker that sent a batch, and when it was last heard from.
CREATE TABLE gateways (
    gateway_id TEXT PRIMARY KEY,
    first_seen DOUBLE PRECISION NOT NULL,
    last_seen DOUBLE PRECISION NOT NULL
);
