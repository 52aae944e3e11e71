-- One line per SKU of an order; the order id is the reservation token in Redis.
-- +goose Up
CREATE TABLE order_items (
  order_id VARCHAR(40) NOT NULL,
  sku      VARCHAR(64) NOT NULL,
  qty      INT         NOT NULL,
  PRIMARY KEY (order_id, sku),
  KEY order_items_sku (sku),
  CONSTRAINT order_items_qty_valid CHECK (qty > 0)
) ENGINE=InnoDB;

-- +goose Down
DROP TABLE order_items;
