-- What each buyer holds or bought of each SKU that has a per-user limit: the
-- database's record of the limit (Redis only pre-filters seckill buyers, and
-- forgets on a flush). A reservation counts here in the transaction that
-- records it, under a conditional increment (qty + n <= the SKU's limit),
-- and comes back when it is released (cancel, timeout). The backfill counts
-- today's live and sold order lines of limited SKUs; 00016 marks them.
-- +goose Up
CREATE TABLE buyer_quotas (
  sku     VARCHAR(64) NOT NULL,
  user_id VARCHAR(64) NOT NULL,
  qty     BIGINT      NOT NULL DEFAULT 0,
  PRIMARY KEY (sku, user_id),
  CONSTRAINT buyer_quotas_qty_valid CHECK (qty >= 0)
) ENGINE=InnoDB;

INSERT INTO buyer_quotas (sku, user_id, qty)
SELECT r.sku, o.user_id, SUM(r.qty)
FROM stock_reservations r JOIN orders o ON o.id = r.order_id JOIN skus s ON s.sku = r.sku
WHERE s.per_user_limit > 0 AND r.state <> 'RELEASED'
GROUP BY r.sku, o.user_id;

-- +goose Down
DROP TABLE buyer_quotas;
