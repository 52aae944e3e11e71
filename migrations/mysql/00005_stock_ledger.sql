-- One row per (order, SKU, operation) applied to skus.stock, inserted in the
-- same transaction as the UPDATE: the unique key makes redelivery a no-op.
-- +goose Up
CREATE TABLE stock_ledger (
  id         BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
  order_id   VARCHAR(40) NOT NULL,
  sku        VARCHAR(64) NOT NULL,
  op         VARCHAR(16) NOT NULL,
  qty        INT         NOT NULL,
  applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  UNIQUE KEY stock_ledger_op (order_id, sku, op),
  KEY stock_ledger_sku (sku)
) ENGINE=InnoDB;

-- +goose Down
DROP TABLE stock_ledger;
