-- The embedded default's copy of mysql/00020.
-- +goose Up
CREATE TABLE stock_adjustments (
  sku        TEXT     NOT NULL,
  reference  TEXT     NOT NULL,
  delta      INTEGER  NOT NULL,
  reason     TEXT     NOT NULL,
  created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (sku, reference)
);

INSERT OR IGNORE INTO stock_adjustments (sku, reference, delta, reason, created_at)
SELECT sku, reference, on_hand_delta, reason, created_at FROM stock_movements
WHERE kind IN ('RESTOCK', 'CORRECTION') AND reference <> ''
ORDER BY id;

-- +goose Down
DROP TABLE stock_adjustments;
