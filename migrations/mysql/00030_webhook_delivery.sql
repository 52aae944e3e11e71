-- Webhook delivery state (docs/design.md "Delivering stock events"), kept
-- in the database so a node that takes a subscription over from a dead one
-- goes on where it stopped, with the same backoff: attempts counts the
-- failed attempts at the subscription's oldest undelivered event in a row,
-- failing_since is when the first of them failed (the subscription turns
-- failing once that is INVENTORY_WEBHOOK_FAILING_AFTER ago), and
-- next_attempt_at is when the next may start (NULL: now). A success clears
-- the three; so does POST /v1/webhooks/{id}/resume.
-- +goose Up
ALTER TABLE webhooks
  ADD COLUMN attempts        INT         NOT NULL DEFAULT 0,
  ADD COLUMN failing_since   DATETIME(6) NULL,
  ADD COLUMN next_attempt_at DATETIME(6) NULL;

-- +goose Down
ALTER TABLE webhooks DROP COLUMN attempts, DROP COLUMN failing_since, DROP COLUMN next_attempt_at;
