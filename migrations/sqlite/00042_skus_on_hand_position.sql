-- The embedded default's copy of mysql/00042.
-- +goose Up
ALTER TABLE skus ADD COLUMN on_hand_position INTEGER NOT NULL DEFAULT 0;
ALTER TABLE skus ADD COLUMN on_hand_moved_at DATETIME NULL;
UPDATE skus SET on_hand_position = COALESCE((SELECT MAX(position) FROM stock_movements m
  WHERE m.sku = skus.sku AND m.kind <> 'COUNT' AND (m.on_hand_delta <> 0 OR m.kind = 'SET')), 0);
UPDATE skus SET on_hand_moved_at = (SELECT created_at FROM stock_movements m
  WHERE m.sku = skus.sku AND m.position = skus.on_hand_position) WHERE on_hand_position > 0;

-- +goose Down
ALTER TABLE skus DROP COLUMN on_hand_moved_at;
ALTER TABLE skus DROP COLUMN on_hand_position;
