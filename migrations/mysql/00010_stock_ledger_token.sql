-- Ledger rows are keyed by reservation token, SKU and operation.
-- +goose Up
ALTER TABLE stock_ledger CHANGE COLUMN order_id token VARCHAR(140) NOT NULL;

-- +goose Down
ALTER TABLE stock_ledger CHANGE COLUMN token order_id VARCHAR(40) NOT NULL;
