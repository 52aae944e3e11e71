-- The embedded default's copy of mysql/00007 (the embedded database starts empty: no backfill).
-- +goose Up
CREATE TABLE stock_reservations (
  token      TEXT     NOT NULL,
  sku        TEXT     NOT NULL,
  order_id   TEXT     NULL,
  qty        INTEGER  NOT NULL CHECK (qty >= 0),
  state      TEXT     NOT NULL CHECK (state IN ('HELD', 'COMMITTED', 'SOLD', 'RELEASED')),
  result     INTEGER  NOT NULL DEFAULT 0,
  expires_at DATETIME NOT NULL,
  created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (token, sku)
);
CREATE INDEX stock_reservations_sku_state ON stock_reservations (sku, state, token);
CREATE INDEX stock_reservations_state_expires ON stock_reservations (state, expires_at);

-- +goose Down
DROP TABLE stock_reservations;
