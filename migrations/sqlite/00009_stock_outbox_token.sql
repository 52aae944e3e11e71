-- +goose Up
ALTER TABLE stock_outbox RENAME COLUMN order_id TO token;

-- +goose Down
ALTER TABLE stock_outbox RENAME COLUMN token TO order_id;
