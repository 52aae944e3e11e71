-- +goose Up
CREATE TABLE stock_anomalies (
  id          INTEGER  NOT NULL PRIMARY KEY AUTOINCREMENT,
  order_id    TEXT     NOT NULL,
  sku         TEXT     NOT NULL,
  op          TEXT     NOT NULL,
  qty         INTEGER  NOT NULL,
  db_stock    INTEGER  NOT NULL,
  reason      TEXT     NOT NULL,
  created_at  DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  resolved_at DATETIME NULL,
  UNIQUE (order_id, sku, op)
);

-- +goose Down
DROP TABLE stock_anomalies;
