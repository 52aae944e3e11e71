-- +goose Up
CREATE TABLE order_items (
  order_id TEXT    NOT NULL,
  sku      TEXT    NOT NULL,
  qty      INTEGER NOT NULL CHECK (qty > 0),
  PRIMARY KEY (order_id, sku)
);
CREATE INDEX order_items_sku ON order_items (sku);

-- +goose Down
DROP TABLE order_items;
