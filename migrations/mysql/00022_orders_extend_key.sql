-- An extension of an unpaid order's hold (POST /v1/orders/{id}/extend)
-- remembers the Idempotency-Key it was sent with, so a retry answers the
-- deadline the first call set instead of extending again. Only the last
-- extension's key is kept: NULL for every order never extended (and every
-- order written before this migration). The table is utf8mb4_bin since
-- 00018, so the key compares byte for byte like every other name.
-- +goose Up
ALTER TABLE orders ADD COLUMN extend_key VARCHAR(128) NULL;

-- +goose Down
ALTER TABLE orders DROP COLUMN extend_key;
