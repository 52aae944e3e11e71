-- applied_at is when the consumer applied (or recorded as an anomaly) the
-- row's operation, written in the consumer's transaction. The sync backlog is
-- then the rows with applied_at NULL, read through an index of unapplied rows
-- only, instead of joining the whole outbox with the whole ledger at every
-- scrape; retention prunes applied rows by it. The backfill marks what the
-- ledger and the anomalies already hold.
-- +goose Up
ALTER TABLE stock_outbox ADD COLUMN applied_at DATETIME(6) NULL AFTER sent_at,
  ADD KEY stock_outbox_unapplied (applied_at, id);
UPDATE stock_outbox ob JOIN stock_ledger l ON l.token = ob.token AND l.sku = ob.sku AND l.op = ob.op
SET ob.applied_at = l.applied_at;
UPDATE stock_outbox ob JOIN stock_anomalies a ON a.token = ob.token AND a.sku = ob.sku AND a.op = ob.op
SET ob.applied_at = CURRENT_TIMESTAMP(6)
WHERE ob.applied_at IS NULL;

-- +goose Down
ALTER TABLE stock_outbox DROP KEY stock_outbox_unapplied, DROP COLUMN applied_at;
