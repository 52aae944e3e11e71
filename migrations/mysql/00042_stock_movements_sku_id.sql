-- A count's rebase reads each SKU's movements since counted_at, and since
-- what its first read saw, as a short range of (sku, id) per SKU
-- (arbiter.ReadRebase, movedSince, movementsSince). Migration 33 replaced
-- this key with (sku, position), which serves the history's pages but not
-- a bound on the id: with it, a SKU's read walks its whole history (InnoDB
-- appends the id to the key, after the position), so a hot SKU's count
-- line would read every movement retention keeps. The key costs every
-- movement's INSERT one more entry, appended at the end of its SKU's range.
-- +goose Up
ALTER TABLE stock_movements ADD KEY stock_movements_sku (sku, id);

-- +goose Down
ALTER TABLE stock_movements DROP KEY stock_movements_sku;
