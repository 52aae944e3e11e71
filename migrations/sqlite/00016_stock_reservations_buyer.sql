-- The embedded default's copy of mysql/00016.
-- +goose Up
ALTER TABLE stock_reservations ADD COLUMN buyer TEXT NULL;
UPDATE stock_reservations
SET buyer = (SELECT o.user_id FROM orders o WHERE o.id = stock_reservations.order_id)
WHERE state <> 'RELEASED' AND order_id IS NOT NULL
  AND sku IN (SELECT sku FROM skus WHERE per_user_limit > 0);

-- +goose Down
ALTER TABLE stock_reservations DROP COLUMN buyer;
