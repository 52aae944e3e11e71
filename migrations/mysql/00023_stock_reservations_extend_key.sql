-- The token API's extension of a hold (POST /v1/stock/extend) remembers
-- its Idempotency-Key as orders.extend_key does (00022): NULL for every
-- reservation never extended.
-- +goose Up
ALTER TABLE stock_reservations ADD COLUMN extend_key VARCHAR(128) NULL;

-- +goose Down
ALTER TABLE stock_reservations DROP COLUMN extend_key;
