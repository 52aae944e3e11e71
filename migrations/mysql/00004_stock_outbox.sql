-- Stock operations to publish to RocketMQ, written in the same transaction as
-- the order transition that causes them (payment: DEDUCT, refund: RESTORE), and
-- relayed to the ordered topic. A row without a ledger row is "not yet applied".
-- +goose Up
CREATE TABLE stock_outbox (
  id         BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
  order_id   VARCHAR(40) NOT NULL,
  sku        VARCHAR(64) NOT NULL,
  op         VARCHAR(16) NOT NULL,
  qty        INT         NOT NULL,
  created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  sent_at    DATETIME(6) NULL,
  UNIQUE KEY stock_outbox_op (order_id, sku, op),
  KEY stock_outbox_unsent (sent_at, id),
  KEY stock_outbox_sku (sku),
  CONSTRAINT stock_outbox_qty_valid CHECK (qty > 0)
) ENGINE=InnoDB;

-- +goose Down
DROP TABLE stock_outbox;
