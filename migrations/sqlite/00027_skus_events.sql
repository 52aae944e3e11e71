-- The embedded default's copy of mysql/00027.
-- +goose Up
ALTER TABLE skus ADD COLUMN low_stock_threshold INTEGER NOT NULL DEFAULT 0 CHECK (low_stock_threshold >= 0);
ALTER TABLE skus ADD COLUMN event_flags INTEGER NOT NULL DEFAULT 0;
ALTER TABLE skus ADD COLUMN event_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE skus ADD COLUMN level_dirty INTEGER NOT NULL DEFAULT 0;
ALTER TABLE skus ADD COLUMN level_at DATETIME NULL;
CREATE INDEX skus_level_dirty ON skus (level_dirty);
UPDATE skus SET event_flags = 2 WHERE on_hand <> -1 AND on_hand - reserved <= 0;

-- +goose Down
DROP INDEX skus_level_dirty;
ALTER TABLE skus DROP COLUMN level_at;
ALTER TABLE skus DROP COLUMN level_dirty;
ALTER TABLE skus DROP COLUMN event_seq;
ALTER TABLE skus DROP COLUMN event_flags;
ALTER TABLE skus DROP COLUMN low_stock_threshold;
