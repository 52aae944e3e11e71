-- The counted_at of the latest count applied to the SKU (NULL: none). A
-- count no later than it is superseded for the SKU: its correction would
-- undo or repeat the later one's.
-- +goose Up
ALTER TABLE skus ADD COLUMN counted_at DATETIME(6) NULL;

-- +goose Down
ALTER TABLE skus DROP COLUMN counted_at;
