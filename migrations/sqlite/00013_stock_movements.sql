-- The embedded default's copy of mysql/00013 (same table, rules and backfill).
-- +goose Up
CREATE TABLE stock_movements (
  id             INTEGER  NOT NULL PRIMARY KEY AUTOINCREMENT,
  sku            TEXT     NOT NULL,
  kind           TEXT     NOT NULL
    CHECK (kind IN ('RESERVE', 'RELEASE', 'SALE', 'RESTOCK', 'CORRECTION', 'REFUND', 'SET')),
  on_hand_delta  INTEGER  NOT NULL,
  reserved_delta INTEGER  NOT NULL,
  reason         TEXT     NOT NULL DEFAULT '',
  reference      TEXT     NOT NULL DEFAULT '',
  created_at     DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP
);
CREATE INDEX stock_movements_sku ON stock_movements (sku, id);

INSERT INTO stock_movements (sku, kind, on_hand_delta, reserved_delta, reason)
SELECT sku, 'SET', on_hand, reserved, 'opening balance (migration 00013)'
FROM skus ORDER BY sku;

-- +goose Down
DROP TABLE stock_movements;
