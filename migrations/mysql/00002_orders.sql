-- Orders. Every status change is a conditional UPDATE ... WHERE status = ?.
-- The (status, expires_at) index serves the timeout sweep. reservation_token
-- is the token the order's stock is held under in Redis: the order id, or a
-- new token when a late payment re-reserves.
-- +goose Up
CREATE TABLE orders (
  id              VARCHAR(40)  NOT NULL PRIMARY KEY,
  user_id         VARCHAR(64)  NOT NULL,
  idempotency_key VARCHAR(128) NULL,
  status          VARCHAR(16)  NOT NULL,
  reservation_token VARCHAR(128) NOT NULL,
  payment_id      VARCHAR(128) NULL,
  expires_at      DATETIME(6)  NOT NULL,
  paid_at         DATETIME(6)  NULL,
  created_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  UNIQUE KEY orders_idempotency (user_id, idempotency_key),
  UNIQUE KEY orders_payment (payment_id),
  KEY orders_status_expires (status, expires_at)
) ENGINE=InnoDB;

-- +goose Down
DROP TABLE orders;
