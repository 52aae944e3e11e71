-- +goose Up
CREATE TABLE stock_outbox (
  id         INTEGER  NOT NULL PRIMARY KEY AUTOINCREMENT,
  order_id   TEXT     NOT NULL,
  sku        TEXT     NOT NULL,
  op         TEXT     NOT NULL,
  qty        INTEGER  NOT NULL CHECK (qty > 0),
  created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  sent_at    DATETIME NULL,
  UNIQUE (order_id, sku, op)
);
CREATE INDEX stock_outbox_unsent ON stock_outbox (sent_at, id);
CREATE INDEX stock_outbox_sku ON stock_outbox (sku);

-- +goose Down
DROP TABLE stock_outbox;
