-- Conveyor PostgreSQL store, migration 23: batches (`conveyor_core::batch`). A kind may say its
-- jobs go out in batches (`BatchSpec` as JSON); the jobs themselves carry nothing new, as a
-- batch fetch reads a kind's available jobs through the claim index.
ALTER TABLE @schema@.kinds ADD COLUMN batch jsonb;
