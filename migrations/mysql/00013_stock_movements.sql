-- The stock movement history: one immutable row per change of a SKU's on_hand
-- or reserved, inserted in the transaction of the change (a reservation, a
-- release, a sale or refund the consumer applies, an adjust, a set, a
-- reconcile repair). A mistake is fixed by a correcting movement, never by
-- editing one, so the history is the audit trail: per SKU, the sums of
-- on_hand_delta and reserved_delta are on_hand and reserved.
-- id is the reader's cursor; (sku, id) serves a SKU's history page by page.
-- reference names what caused the movement: an order id, "token:" + a token
-- API token, or the reference an adjust carried (a purchase order).
-- The backfill opens each existing SKU's history with its current quantities,
-- so the sums hold for SKUs created before the history existed.
-- +goose Up
CREATE TABLE stock_movements (
  id             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  sku            VARCHAR(64)  NOT NULL,
  kind           VARCHAR(16)  NOT NULL,
  on_hand_delta  BIGINT       NOT NULL,
  reserved_delta BIGINT       NOT NULL,
  reason         VARCHAR(255) NOT NULL DEFAULT '',
  reference      VARCHAR(140) NOT NULL DEFAULT '',
  created_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  KEY stock_movements_sku (sku, id),
  CONSTRAINT stock_movements_kind_valid
    CHECK (kind IN ('RESERVE', 'RELEASE', 'SALE', 'RESTOCK', 'CORRECTION', 'REFUND', 'SET'))
) ENGINE=InnoDB;

INSERT INTO stock_movements (sku, kind, on_hand_delta, reserved_delta, reason)
SELECT sku, 'SET', on_hand, reserved, 'opening balance (migration 00013)'
FROM skus ORDER BY sku;

-- +goose Down
DROP TABLE stock_movements;
