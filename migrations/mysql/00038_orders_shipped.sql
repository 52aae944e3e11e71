-- When a paid order's lines left the warehouse (POST /v1/orders/{id}/ship;
-- NULL: not shipped). A shipped order refunds as any paid order.
-- +goose Up
ALTER TABLE orders ADD COLUMN shipped_at DATETIME(6) NULL;

-- +goose Down
ALTER TABLE orders DROP COLUMN shipped_at;
