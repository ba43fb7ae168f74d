-- Joining nodes (mutual TLS on the agent port): join tokens and the node certificates
-- the cluster CA signed. Numbered 0005: 0004 is the leader lease. Both backends run it.

-- A join token is shown once; only the keyed hash of its secret part is kept (like API
-- keys). Single use: used_at/used_by are set by the join that spends it, and a token is
-- also refused after expires_at (unix seconds) whether used or not.
CREATE TABLE join_tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    used_at DOUBLE PRECISION,
    used_by TEXT
);

-- Every node certificate issued, by serial (hex). revoked_at is set when the node is
-- removed; the agent port refuses a certificate that is revoked or was never issued here.
CREATE TABLE node_certificates (
    serial TEXT PRIMARY KEY,
    node_id TEXT NOT NULL,
    token_id TEXT NOT NULL,
    issued_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION
);
CREATE INDEX node_certificates_node ON node_certificates (node_id);
