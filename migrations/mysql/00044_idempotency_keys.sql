-- A buyer's Idempotency-Key and the order it made, in a table of its own
-- (issue 43): written in the sale's commit only when a key is given, and
-- what makes a retry a duplicate whichever way the order was written.
-- A new table: nothing that serves waits for it.
-- +goose Up
CREATE TABLE idempotency_keys (
  user_id         VARCHAR(64)  NOT NULL,
  idempotency_key VARCHAR(128) NOT NULL,
  order_id        VARCHAR(40)  NOT NULL,
  created_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (user_id, idempotency_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE idempotency_keys;
