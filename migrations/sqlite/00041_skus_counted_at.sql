-- The embedded default's copy of mysql/00041.
-- +goose Up
ALTER TABLE skus ADD COLUMN counted_at DATETIME NULL;

-- +goose Down
ALTER TABLE skus DROP COLUMN counted_at;
