-- A movement's position: its place in its SKU's history, 1, 2, 3, ... with
-- no gap, in the order the changes committed (docs/design.md "Stock
-- movements"). skus.movement_position is the position of the SKU's last
-- movement: the UPDATE each change sends anyway bumps it by the number of
-- movements the change writes, under the SKU's row lock, and the
-- movements take the positions up to it. So a transaction that commits
-- later numbers its movements after every movement a reader could already
-- have seen, and GET /v1/skus/{sku}/movements?after=<position> can be
-- followed without skipping one (a cursor on the auto-increment id only
-- holds as long as every writer inserts under that lock).
-- The unique key serves a SKU's pages in position order (it replaces the
-- (sku, id) key) and refuses two movements of a SKU at one position, which
-- only a writer outside the row lock could make; the column has no
-- default, so a writer that numbers nothing is refused too.
-- Existing movements are numbered in id order per SKU: the order the
-- history was read in until now.
-- Two tables in one file, the one number this change has: if the skus
-- statements fail, the stock_movements ones stay applied (MySQL commits
-- DDL) and must be rolled back by hand (the Down's last statement) before
-- migrate runs again.
-- +goose Up
ALTER TABLE stock_movements ADD COLUMN position BIGINT NOT NULL DEFAULT 0 AFTER sku;
UPDATE stock_movements m
  JOIN (SELECT id, ROW_NUMBER() OVER (PARTITION BY sku ORDER BY id) AS n FROM stock_movements) o ON o.id = m.id
  SET m.position = o.n;
ALTER TABLE stock_movements
  ALTER COLUMN position DROP DEFAULT,
  ADD UNIQUE KEY stock_movements_sku_position (sku, position),
  DROP KEY stock_movements_sku,
  ADD CONSTRAINT stock_movements_position_valid CHECK (position >= 1);
ALTER TABLE skus ADD COLUMN movement_position BIGINT NOT NULL DEFAULT 0;
UPDATE skus s JOIN (SELECT sku, MAX(position) AS last FROM stock_movements GROUP BY sku) m ON m.sku = s.sku
  SET s.movement_position = m.last;

-- +goose Down
ALTER TABLE skus DROP COLUMN movement_position;
ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_position_valid, ADD KEY stock_movements_sku (sku, id),
  DROP KEY stock_movements_sku_position, DROP COLUMN position;
