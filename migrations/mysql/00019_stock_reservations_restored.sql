-- A refunded sale's reservation turns RESTORED when the ordered consumer
-- gives its units back, so whether a restore was applied is read from the
-- reservation (never pruned) and not from the ledger (pruned by retention):
-- a refund a month after the sale applies once. The backfill marks the sales
-- whose restore the ledger still shows.
-- +goose Up
ALTER TABLE stock_reservations DROP CONSTRAINT stock_reservations_state_valid;
ALTER TABLE stock_reservations ADD CONSTRAINT stock_reservations_state_valid
  CHECK (state IN ('HELD', 'COMMITTED', 'SOLD', 'RESTORED', 'RELEASED'));
UPDATE stock_reservations r JOIN stock_ledger l ON l.token = r.token AND l.sku = r.sku AND l.op = 'RESTORE'
SET r.state = 'RESTORED'
WHERE r.state = 'SOLD';

-- +goose Down
UPDATE stock_reservations SET state = 'SOLD' WHERE state = 'RESTORED';
ALTER TABLE stock_reservations DROP CONSTRAINT stock_reservations_state_valid;
ALTER TABLE stock_reservations ADD CONSTRAINT stock_reservations_state_valid
  CHECK (state IN ('HELD', 'COMMITTED', 'SOLD', 'RELEASED'));
