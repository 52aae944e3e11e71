-- The SKU's last movement that changed on_hand, a count's aside: its
-- position (0: none) and its created_at (NULL: none). Every change of
-- on_hand but a count's sets them in the UPDATE that moves on_hand, under
-- the row lock (a reservation or a release, which moves only reserved,
-- leaves them), and a count's rebase reads them: the movements it sums
-- (those that changed on_hand since counted_at, COUNT ones aside, and a
-- put's SET) are at or below that position, and none when that movement
-- was stamped over two minutes before counted_at (internal/arbiter
-- counts.go, rebaseMargin). So a SKU selling thousands of units a second
-- is rebased without reading the reservations it wrote since.
-- Existing SKUs take their last such movement (a SET always counts: a
-- put's, or an opening balance).
-- +goose Up
ALTER TABLE skus ADD COLUMN on_hand_position BIGINT NOT NULL DEFAULT 0, ADD COLUMN on_hand_moved_at DATETIME(6) NULL;
UPDATE skus s
  JOIN (SELECT sku, MAX(position) AS p FROM stock_movements
        WHERE kind <> 'COUNT' AND (on_hand_delta <> 0 OR kind = 'SET') GROUP BY sku) l ON l.sku = s.sku
  JOIN stock_movements m ON m.sku = l.sku AND m.position = l.p
  SET s.on_hand_position = l.p, s.on_hand_moved_at = m.created_at;

-- +goose Down
ALTER TABLE skus DROP COLUMN on_hand_moved_at, DROP COLUMN on_hand_position;
