-- Every reservation the database has arbitrated: an order line or a raw
-- reservation of the token API. A row is live while HELD (unpaid) or
-- COMMITTED (paid, not yet deducted from on_hand); skus.reserved is the sum of
-- the live rows' qty. token is namespaced: an order's reservation token (its
-- id, or id + ".late") or "t." + the client's token, so the two can never meet.
-- result is what Redis said was left when it admitted the reservation (the
-- token API answers replays with it).
-- The backfill turns today's pending orders and paid-but-unapplied lines into
-- rows, keyed by the token their outbox rows carry.
-- +goose Up
CREATE TABLE stock_reservations (
  token      VARCHAR(140) NOT NULL,
  sku        VARCHAR(64)  NOT NULL,
  order_id   VARCHAR(40)  NULL,
  qty        INT          NOT NULL,
  state      VARCHAR(12)  NOT NULL,
  result     BIGINT       NOT NULL DEFAULT 0,
  expires_at DATETIME(6)  NOT NULL,
  created_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (token, sku),
  KEY stock_reservations_sku_state (sku, state, token),
  KEY stock_reservations_state_expires (state, expires_at),
  CONSTRAINT stock_reservations_qty_valid CHECK (qty >= 0),
  CONSTRAINT stock_reservations_state_valid CHECK (state IN ('HELD', 'COMMITTED', 'SOLD', 'RELEASED'))
) ENGINE=InnoDB;

INSERT INTO stock_reservations (token, sku, order_id, qty, state, expires_at)
SELECT o.reservation_token, i.sku, o.id, i.qty, 'HELD', o.expires_at
FROM orders o JOIN order_items i ON i.order_id = o.id
WHERE o.status = 'PENDING';

INSERT INTO stock_reservations (token, sku, order_id, qty, state, expires_at)
SELECT ob.order_id, ob.sku, o.id, ob.qty, 'COMMITTED', o.expires_at
FROM stock_outbox ob JOIN orders o ON o.id = ob.order_id
LEFT JOIN stock_ledger l ON l.order_id = ob.order_id AND l.sku = ob.sku AND l.op = ob.op
LEFT JOIN stock_anomalies a ON a.order_id = ob.order_id AND a.sku = ob.sku AND a.op = ob.op
WHERE ob.op = 'DEDUCT' AND l.id IS NULL AND a.id IS NULL;

-- +goose Down
DROP TABLE stock_reservations;
