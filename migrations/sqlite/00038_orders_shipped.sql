-- The embedded default's copy of mysql/00038.
-- +goose Up
ALTER TABLE orders ADD COLUMN shipped_at DATETIME NULL;

-- +goose Down
ALTER TABLE orders DROP COLUMN shipped_at;
