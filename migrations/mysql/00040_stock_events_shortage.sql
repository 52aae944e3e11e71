-- sku.shortage (a count found fewer units than are held) names the units it
-- could not take (short) and the count (count_id); NULL for every other event.
-- +goose Up
ALTER TABLE stock_events ADD COLUMN short BIGINT NULL, ADD COLUMN count_id VARCHAR(64) NULL;

-- +goose Down
ALTER TABLE stock_events DROP COLUMN count_id, DROP COLUMN short;
