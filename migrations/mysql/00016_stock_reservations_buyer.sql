-- buyer is the user a reservation counts against in buyer_quotas (NULL when
-- it does not count: a token-API reservation, or a SKU without a per-user
-- limit when it was made), so a release gives back exactly what was counted
-- even if the SKU's limit changed since.
-- +goose Up
ALTER TABLE stock_reservations ADD COLUMN buyer VARCHAR(64) NULL AFTER order_id;
UPDATE stock_reservations r JOIN orders o ON o.id = r.order_id JOIN skus s ON s.sku = r.sku
SET r.buyer = o.user_id
WHERE s.per_user_limit > 0 AND r.state <> 'RELEASED';

-- +goose Down
ALTER TABLE stock_reservations DROP COLUMN buyer;
