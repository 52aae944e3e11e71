-- The embedded default's copy of mysql/00044.
-- +goose Up
CREATE TABLE idempotency_keys (
  user_id         TEXT     NOT NULL,
  idempotency_key TEXT     NOT NULL,
  order_id        TEXT     NOT NULL,
  created_at      DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (user_id, idempotency_key)
);

-- +goose Down
DROP TABLE idempotency_keys;
