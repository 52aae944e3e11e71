-- The embedded default's copy of mysql/00030.
-- +goose Up
ALTER TABLE webhooks ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE webhooks ADD COLUMN failing_since DATETIME NULL;
ALTER TABLE webhooks ADD COLUMN next_attempt_at DATETIME NULL;

-- +goose Down
ALTER TABLE webhooks DROP COLUMN next_attempt_at;
ALTER TABLE webhooks DROP COLUMN failing_since;
ALTER TABLE webhooks DROP COLUMN attempts;
