-- The embedded default's copy of mysql/00017.
-- +goose Up
ALTER TABLE stock_outbox ADD COLUMN applied_at DATETIME NULL;
CREATE INDEX stock_outbox_unapplied ON stock_outbox (applied_at, id);
UPDATE stock_outbox SET applied_at = (SELECT l.applied_at FROM stock_ledger l
  WHERE l.token = stock_outbox.token AND l.sku = stock_outbox.sku AND l.op = stock_outbox.op);
UPDATE stock_outbox SET applied_at = CURRENT_TIMESTAMP
WHERE applied_at IS NULL AND EXISTS (SELECT 1 FROM stock_anomalies a
  WHERE a.token = stock_outbox.token AND a.sku = stock_outbox.sku AND a.op = stock_outbox.op);

-- +goose Down
DROP INDEX stock_outbox_unapplied;
ALTER TABLE stock_outbox DROP COLUMN applied_at;
