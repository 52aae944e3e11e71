-- order_items_sku (sku) served no query: the service reads an order's items
-- by its id (the primary key, order_id first), and every per-SKU question
-- (what is reserved, sold, held) is asked of stock_reservations, whose
-- (sku, state, token) index answers it. Each order line paid for the index
-- entry all the same, on the sale's path (EXPLAIN of every query the code
-- runs on orders and order_items: docs/benchmarks.md).
-- +goose Up
ALTER TABLE order_items DROP KEY order_items_sku;

-- +goose Down
ALTER TABLE order_items ADD KEY order_items_sku (sku);
