-- Conveyor PostgreSQL store, migration 18: the `viewer` role (reads everything, changes
-- nothing). The role's check is replaced; existing tokens all satisfy the new one.
ALTER TABLE @schema@.api_tokens DROP CONSTRAINT IF EXISTS api_tokens_role_check;
ALTER TABLE @schema@.api_tokens ADD CONSTRAINT api_tokens_role_check
    CHECK (role IN ('producer', 'worker', 'admin', 'viewer'));
