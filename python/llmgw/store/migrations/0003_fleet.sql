-- The fleet: nodes as their agents registered them, models added through the admin API
-- (those of server.yaml are not stored: the file stays their one source), scale set by
-- operators, and every replica the control plane placed. JSON columns are text; times
-- are unix seconds. Both backends run this file.

-- labels: {"key": "value"}; inventory: GPUs, CPU, memory, engines, the agent's version,
-- boot id and address, as the control plane last heard them. state is what the control
-- plane recorded (ready, cordoned, draining, unreachable, lost); admin_state is what an
-- operator asked for, kept apart so a cordoned node that comes back is cordoned again.
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    hostname TEXT NOT NULL,
    labels TEXT NOT NULL DEFAULT '{}',
    inventory TEXT NOT NULL DEFAULT '{}',
    state TEXT NOT NULL,
    admin_state TEXT NOT NULL DEFAULT 'ready'
        CHECK (admin_state IN ('ready', 'cordoned', 'draining')),
    reason TEXT NOT NULL DEFAULT '',
    last_heartbeat DOUBLE PRECISION NOT NULL,
    registered_at DOUBLE PRECISION NOT NULL
);

-- definition: the model as server.yaml's models: list would hold it (catalog.Model).
CREATE TABLE models (
    name TEXT PRIMARY KEY,
    definition TEXT NOT NULL,
    added_at DOUBLE PRECISION NOT NULL
);

-- An operator's scale for a model (held to its min..max); absent: min_replicas.
CREATE TABLE model_scale (
    model TEXT PRIMARY KEY,
    replicas BIGINT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

-- gpus: the UUIDs of its GPUs (JSON list). gpu_memory, cpu and memory are what it holds
-- (its profile's, as placed), so the capacity ledger can be rebuilt from the store alone.
-- Stopped replicas are kept a while so that their ids are not reused while anything may
-- still refer to them.
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    profile TEXT NOT NULL,
    node TEXT NOT NULL,
    gpus TEXT NOT NULL DEFAULT '[]',
    state TEXT NOT NULL,
    port BIGINT,
    restarts BIGINT NOT NULL DEFAULT 0,
    reason TEXT NOT NULL DEFAULT '',
    gpu_memory BIGINT NOT NULL DEFAULT 0,
    cpu DOUBLE PRECISION NOT NULL DEFAULT 0,
    memory BIGINT NOT NULL DEFAULT 0,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX replicas_model ON replicas (model);
CREATE INDEX replicas_node ON replicas (node);
