-- Before reservations were rows, a late payment's outbox rows carried the
-- order id while the order recorded "<id>.late". A refund now writes its
-- RESTORE under the order's reservation token, which must be the one its
-- DEDUCT carried: align the orders that already left PENDING.
-- +goose Up
UPDATE orders SET reservation_token = id
WHERE status IN ('PAID', 'REFUND_REQUIRED', 'REFUNDED') AND reservation_token <> id;

-- +goose Down
SELECT 1;
