-- The embedded default's copy of mysql/00019. SQLite cannot change a CHECK
-- in place: the table is rebuilt with it.
-- +goose Up
CREATE TABLE stock_reservations_new (
  token      TEXT     NOT NULL,
  sku        TEXT     NOT NULL,
  order_id   TEXT     NULL,
  buyer      TEXT     NULL,
  qty        INTEGER  NOT NULL CHECK (qty >= 0),
  state      TEXT     NOT NULL CHECK (state IN ('HELD', 'COMMITTED', 'SOLD', 'RESTORED', 'RELEASED')),
  result     INTEGER  NOT NULL DEFAULT 0,
  expires_at DATETIME NOT NULL,
  created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (token, sku)
);
INSERT INTO stock_reservations_new (token, sku, order_id, buyer, qty, state, result, expires_at, created_at, updated_at)
SELECT token, sku, order_id, buyer, qty,
  CASE WHEN state = 'SOLD' AND EXISTS (SELECT 1 FROM stock_ledger l
    WHERE l.token = stock_reservations.token AND l.sku = stock_reservations.sku AND l.op = 'RESTORE') THEN 'RESTORED' ELSE state END,
  result, expires_at, created_at, updated_at
FROM stock_reservations;
DROP TABLE stock_reservations;
ALTER TABLE stock_reservations_new RENAME TO stock_reservations;
CREATE INDEX stock_reservations_sku_state ON stock_reservations (sku, state, token);
CREATE INDEX stock_reservations_state_expires ON stock_reservations (state, expires_at);

-- +goose Down
CREATE TABLE stock_reservations_old (
  token      TEXT     NOT NULL,
  sku        TEXT     NOT NULL,
  order_id   TEXT     NULL,
  buyer      TEXT     NULL,
  qty        INTEGER  NOT NULL CHECK (qty >= 0),
  state      TEXT     NOT NULL CHECK (state IN ('HELD', 'COMMITTED', 'SOLD', 'RELEASED')),
  result     INTEGER  NOT NULL DEFAULT 0,
  expires_at DATETIME NOT NULL,
  created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (token, sku)
);
INSERT INTO stock_reservations_old (token, sku, order_id, buyer, qty, state, result, expires_at, created_at, updated_at)
SELECT token, sku, order_id, buyer, qty, CASE WHEN state = 'RESTORED' THEN 'SOLD' ELSE state END,
  result, expires_at, created_at, updated_at
FROM stock_reservations;
DROP TABLE stock_reservations;
ALTER TABLE stock_reservations_old RENAME TO stock_reservations;
CREATE INDEX stock_reservations_sku_state ON stock_reservations (sku, state, token);
CREATE INDEX stock_reservations_state_expires ON stock_reservations (state, expires_at);
