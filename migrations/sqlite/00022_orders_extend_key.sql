-- The embedded default's copy of mysql/00022.
-- +goose Up
ALTER TABLE orders ADD COLUMN extend_key TEXT NULL;

-- +goose Down
ALTER TABLE orders DROP COLUMN extend_key;
