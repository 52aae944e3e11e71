-- The embedded default's copy of mysql/00015.
-- +goose Up
CREATE TABLE buyer_quotas (
  sku     TEXT    NOT NULL,
  user_id TEXT    NOT NULL,
  qty     INTEGER NOT NULL DEFAULT 0 CHECK (qty >= 0),
  PRIMARY KEY (sku, user_id)
);

INSERT INTO buyer_quotas (sku, user_id, qty)
SELECT r.sku, o.user_id, SUM(r.qty)
FROM stock_reservations r JOIN orders o ON o.id = r.order_id JOIN skus s ON s.sku = r.sku
WHERE s.per_user_limit > 0 AND r.state <> 'RELEASED'
GROUP BY r.sku, o.user_id;

-- +goose Down
DROP TABLE buyer_quotas;
