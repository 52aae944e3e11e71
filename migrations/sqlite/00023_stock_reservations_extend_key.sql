-- The embedded default's copy of mysql/00023.
-- +goose Up
ALTER TABLE stock_reservations ADD COLUMN extend_key TEXT NULL;

-- +goose Down
ALTER TABLE stock_reservations DROP COLUMN extend_key;
