-- Every adjust that carried a reference (a purchase order, a count sheet),
-- once per SKU: an operator's retry of POST /v1/skus/{sku}/adjust after a
-- time-out finds its row and is answered without restocking twice, and
-- another delta under the same reference is a conflict. Never pruned
-- (retention folds the movements, which cannot be what decides this).
-- The backfill takes each reference's first adjust from the movements that
-- are still there.
-- +goose Up
CREATE TABLE stock_adjustments (
  sku        VARCHAR(64)  NOT NULL,
  reference  VARCHAR(128) NOT NULL,
  delta      BIGINT       NOT NULL,
  reason     VARCHAR(255) NOT NULL,
  created_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (sku, reference)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT IGNORE INTO stock_adjustments (sku, reference, delta, reason, created_at)
SELECT sku, reference, on_hand_delta, reason, created_at FROM stock_movements
WHERE kind IN ('RESTOCK', 'CORRECTION') AND reference <> ''
ORDER BY id;

-- +goose Down
DROP TABLE stock_adjustments;
