-- What a count needs to know of an order line's units besides on_hand: when
-- they left on_hand (sold_at: the SALE movement's created_at, written by
-- the consumer with it), when they left the warehouse (shipped_at: POST
-- /v1/orders/{id}/ship) and when a refund gave them back to on_hand
-- (restored_at: the REFUND movement's created_at). Units sold before a
-- count's counted_at and not shipped before it are on the shelf but not in
-- on_hand; units shipped before it and not yet sold are in on_hand but not
-- on the shelf (docs/design.md "Counts are rebased"). Token-API sales have
-- no row (no shipped signal: counted as shipped when sold). Retention
-- deletes a row once it can no longer change a count the service accepts
-- (sold and shipped, or restored, before the counts' horizon).
-- +goose Up
CREATE TABLE stock_shipping (
  token       VARCHAR(140) NOT NULL,
  sku         VARCHAR(64)  NOT NULL,
  qty         INT          NOT NULL,
  sold_at     DATETIME(6)  NULL,
  shipped_at  DATETIME(6)  NULL,
  restored_at DATETIME(6)  NULL,
  PRIMARY KEY (token, sku),
  KEY stock_shipping_sku (sku),
  KEY stock_shipping_shipped (shipped_at),
  KEY stock_shipping_restored (restored_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE stock_shipping;
