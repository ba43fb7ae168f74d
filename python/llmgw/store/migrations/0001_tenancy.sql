-- The tenancy tree (orgs > teams > projects), users and their memberships, API keys,
-- the audit log and the gateways' snapshot version. Both backends run this file.
-- Limits are JSON text (wire.Limits); times are unix seconds; flags are 0/1.

CREATE TABLE orgs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    max_key_ttl DOUBLE PRECISION,
    limits TEXT NOT NULL DEFAULT '{}',
    created_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE teams (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    name TEXT NOT NULL,
    max_key_ttl DOUBLE PRECISION,
    limits TEXT NOT NULL DEFAULT '{}',
    created_at DOUBLE PRECISION NOT NULL,
    UNIQUE (org_id, name)
);

CREATE TABLE projects (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams (id),
    name TEXT NOT NULL,
    max_key_ttl DOUBLE PRECISION,
    limits TEXT NOT NULL DEFAULT '{}',
    keep_bodies INTEGER NOT NULL DEFAULT 0 CHECK (keep_bodies IN (0, 1)),
    created_at DOUBLE PRECISION NOT NULL,
    UNIQUE (team_id, name)
);

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    email TEXT,
    created_at DOUBLE PRECISION NOT NULL
);

-- scope_id is an org, team or project id (the prefix says which); one table rather than
-- three keeps "which memberships cover project P" one indexed query. Rows at a scope are
-- deleted with the scope, in the same transaction, since a foreign key cannot point at
-- three tables.
CREATE TABLE memberships (
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    scope_id TEXT NOT NULL,
    scope_kind TEXT NOT NULL CHECK (scope_kind IN ('org', 'team', 'project')),
    role TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member', 'viewer')),
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (user_id, scope_id)
);
CREATE INDEX memberships_scope ON memberships (scope_id);

-- Only the keyed hash of a key is kept; prefix is its first 16 characters, for people.
-- user_id is set to NULL when a user is deleted (their keys are revoked first).
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    prefix TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    project_id TEXT NOT NULL REFERENCES projects (id),
    user_id TEXT REFERENCES users (id) ON DELETE SET NULL,
    limits TEXT NOT NULL DEFAULT '{}',
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    revoked_at DOUBLE PRECISION,
    last_used_at DOUBLE PRECISION
);
CREATE INDEX api_keys_project ON api_keys (project_id);
CREATE INDEX api_keys_user ON api_keys (user_id);

-- ids sort by time (hex microseconds first), so "newest first" is an index scan.
CREATE TABLE audit (
    id TEXT PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    before_json TEXT,
    after_json TEXT
);
CREATE INDEX audit_at ON audit (at);

CREATE TABLE state (
    name TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO state (name, value) VALUES ('snapshot_version', 1);
