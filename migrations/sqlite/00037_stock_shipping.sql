-- The embedded default's copy of mysql/00037.
-- +goose Up
CREATE TABLE stock_shipping (
  token       TEXT     NOT NULL,
  sku         TEXT     NOT NULL,
  qty         INTEGER  NOT NULL,
  sold_at     DATETIME NULL,
  shipped_at  DATETIME NULL,
  restored_at DATETIME NULL,
  PRIMARY KEY (token, sku)
);
CREATE INDEX stock_shipping_sku ON stock_shipping (sku);
CREATE INDEX stock_shipping_shipped ON stock_shipping (shipped_at);
CREATE INDEX stock_shipping_restored ON stock_shipping (restored_at);

-- +goose Down
DROP TABLE stock_shipping;
