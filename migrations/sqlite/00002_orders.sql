-- +goose Up
CREATE TABLE orders (
  id                TEXT     NOT NULL PRIMARY KEY,
  user_id           TEXT     NOT NULL,
  idempotency_key   TEXT     NULL,
  status            TEXT     NOT NULL,
  reservation_token TEXT     NOT NULL,
  payment_id        TEXT     NULL UNIQUE,
  expires_at        DATETIME NOT NULL,
  paid_at           DATETIME NULL,
  created_at        DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at        DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  UNIQUE (user_id, idempotency_key)
);
CREATE INDEX orders_status_expires ON orders (status, expires_at);

-- +goose Down
DROP TABLE orders;
