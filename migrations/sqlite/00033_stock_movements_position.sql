-- The embedded default's copy of mysql/00033. SQLite cannot drop a
-- column's default or add a CHECK to an existing table: position keeps
-- its default of 0, which the unique key lets in once per SKU at most;
-- the arbiter numbers every movement it writes.
-- +goose Up
ALTER TABLE stock_movements ADD COLUMN position INTEGER NOT NULL DEFAULT 0;
UPDATE stock_movements SET position = o.n
  FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY sku ORDER BY id) AS n FROM stock_movements) AS o
  WHERE o.id = stock_movements.id;
DROP INDEX stock_movements_sku;
CREATE UNIQUE INDEX stock_movements_sku_position ON stock_movements (sku, position);
ALTER TABLE skus ADD COLUMN movement_position INTEGER NOT NULL DEFAULT 0;
UPDATE skus SET movement_position = COALESCE((SELECT MAX(position) FROM stock_movements m WHERE m.sku = skus.sku), 0);

-- +goose Down
ALTER TABLE skus DROP COLUMN movement_position;
DROP INDEX stock_movements_sku_position;
CREATE INDEX stock_movements_sku ON stock_movements (sku, id);
ALTER TABLE stock_movements DROP COLUMN position;
