-- Operations the consumer refused to apply (they would drive skus.stock below
-- zero). Recorded for operators and reported; never silently dropped.
-- +goose Up
CREATE TABLE stock_anomalies (
  id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  order_id    VARCHAR(40)  NOT NULL,
  sku         VARCHAR(64)  NOT NULL,
  op          VARCHAR(16)  NOT NULL,
  qty         INT          NOT NULL,
  db_stock    BIGINT       NOT NULL,
  reason      VARCHAR(255) NOT NULL,
  created_at  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  resolved_at DATETIME(6)  NULL,
  UNIQUE KEY stock_anomalies_op (order_id, sku, op)
) ENGINE=InnoDB;

-- +goose Down
DROP TABLE stock_anomalies;
