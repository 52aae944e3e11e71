-- +goose Up
ALTER TABLE stock_ledger RENAME COLUMN order_id TO token;

-- +goose Down
ALTER TABLE stock_ledger RENAME COLUMN token TO order_id;
