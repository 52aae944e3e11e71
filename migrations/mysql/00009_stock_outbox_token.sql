-- Outbox rows name the reservation they move (an order's token or a raw
-- token), not an order: the token API commits through the same path.
-- +goose Up
ALTER TABLE stock_outbox CHANGE COLUMN order_id token VARCHAR(140) NOT NULL;

-- +goose Down
ALTER TABLE stock_outbox CHANGE COLUMN token order_id VARCHAR(40) NOT NULL;
