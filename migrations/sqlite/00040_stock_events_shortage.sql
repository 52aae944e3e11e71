-- The embedded default's copy of mysql/00040.
-- +goose Up
ALTER TABLE stock_events ADD COLUMN short INTEGER NULL;
ALTER TABLE stock_events ADD COLUMN count_id TEXT NULL;

-- +goose Down
ALTER TABLE stock_events DROP COLUMN count_id;
ALTER TABLE stock_events DROP COLUMN short;
