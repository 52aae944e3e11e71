-- +goose Up
ALTER TABLE stock_anomalies RENAME COLUMN order_id TO token;
ALTER TABLE stock_anomalies RENAME COLUMN db_stock TO on_hand;

-- +goose Down
ALTER TABLE stock_anomalies RENAME COLUMN on_hand TO db_stock;
ALTER TABLE stock_anomalies RENAME COLUMN token TO order_id;
