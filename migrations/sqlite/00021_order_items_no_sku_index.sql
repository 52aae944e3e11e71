-- The embedded default's copy of mysql/00021: order_items_sku served no query.
-- +goose Up
DROP INDEX order_items_sku;

-- +goose Down
CREATE INDEX order_items_sku ON order_items (sku);
