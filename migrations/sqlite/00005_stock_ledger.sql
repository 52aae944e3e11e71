-- +goose Up
CREATE TABLE stock_ledger (
  id         INTEGER  NOT NULL PRIMARY KEY AUTOINCREMENT,
  order_id   TEXT     NOT NULL,
  sku        TEXT     NOT NULL,
  op         TEXT     NOT NULL,
  qty        INTEGER  NOT NULL,
  applied_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  UNIQUE (order_id, sku, op)
);
CREATE INDEX stock_ledger_sku ON stock_ledger (sku);

-- +goose Down
DROP TABLE stock_ledger;
