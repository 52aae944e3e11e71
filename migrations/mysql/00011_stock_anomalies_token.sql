-- Anomalies are keyed like the ledger; db_stock becomes the on_hand seen.
-- +goose Up
ALTER TABLE stock_anomalies CHANGE COLUMN order_id token VARCHAR(140) NOT NULL,
  CHANGE COLUMN db_stock on_hand BIGINT NOT NULL;

-- +goose Down
ALTER TABLE stock_anomalies CHANGE COLUMN token order_id VARCHAR(40) NOT NULL,
  CHANGE COLUMN on_hand db_stock BIGINT NOT NULL;
