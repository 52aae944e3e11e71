-- The embedded default's copy of mysql/00042 (counts read INDEXED BY it).
-- +goose Up
CREATE INDEX stock_movements_sku ON stock_movements (sku, id);

-- +goose Down
DROP INDEX stock_movements_sku;
