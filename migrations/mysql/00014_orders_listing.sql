-- The order listing (GET /v1/orders) pages newest first by id (UUIDv7, so id
-- order is creation order): WHERE <filter> AND id < cursor ORDER BY id DESC
-- LIMIT n. Each filter gets an index that ends in id, so a page is a short
-- backward range scan, never a sort of the user's or status's whole set:
-- (user_id, id) for a user's orders, (status, id) for a status, and
-- (created_at, id) for a time window (a narrow window is read by range and
-- then ordered by id). A user's orders in one status use (user_id, id) and
-- filter the status on the few rows of that user.
-- +goose Up
ALTER TABLE orders
  ADD KEY orders_user_id (user_id, id),
  ADD KEY orders_status_id (status, id),
  ADD KEY orders_created_id (created_at, id);

-- +goose Down
ALTER TABLE orders
  DROP KEY orders_created_id,
  DROP KEY orders_status_id,
  DROP KEY orders_user_id;
