-- Conveyor PostgreSQL store, migration 9: access control and audit (see
-- `conveyor_core::access`). Only the SHA-256 of each secret is kept; a credential is looked up
-- by its id, then its secret's hash compared in constant time by the server.
-- A name belongs to one active token at a time; a revoked token keeps its name.
CREATE TABLE @schema@.api_tokens (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    role        text NOT NULL CHECK (role IN ('producer', 'worker', 'admin')),
    secret_hash text NOT NULL,
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);
CREATE UNIQUE INDEX api_tokens_active_name ON @schema@.api_tokens (name)
    WHERE revoked_at IS NULL;

-- Browser sessions made by logging in with a token; they go with their token.
CREATE TABLE @schema@.sessions (
    id          uuid PRIMARY KEY,
    secret_hash text NOT NULL,
    token_id    uuid NOT NULL REFERENCES @schema@.api_tokens (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX sessions_token ON @schema@.sessions (token_id);
CREATE INDEX sessions_expiry ON @schema@.sessions (expires_at);

-- Who did what. `id` grows with every append, so it orders and pages entries; `job_ids` holds
-- at most 100 ids, `job_count` the full number.
CREATE TABLE @schema@.audit_log (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at             timestamptz NOT NULL,
    actor          text NOT NULL,
    actor_token_id uuid,
    action         text NOT NULL,
    target         text,
    job_ids        uuid[] NOT NULL,
    job_count      bigint NOT NULL,
    detail         text
);
CREATE INDEX audit_log_action ON @schema@.audit_log (action, id);
