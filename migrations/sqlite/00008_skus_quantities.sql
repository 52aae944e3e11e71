-- The embedded default's copy of mysql/00008: skus rebuilt with its quantity states.
-- +goose Up
CREATE TABLE skus_new (
  sku            TEXT     NOT NULL PRIMARY KEY,
  on_hand        INTEGER  NOT NULL CHECK (on_hand >= -1),
  reserved       INTEGER  NOT NULL DEFAULT 0,
  seq            INTEGER  NOT NULL DEFAULT 0,
  redis_epoch    INTEGER  NOT NULL DEFAULT 0,
  per_user_limit INTEGER  NOT NULL DEFAULT 0 CHECK (per_user_limit >= 0),
  created_at     DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at     DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  CONSTRAINT skus_reserved_valid CHECK (reserved >= 0 AND (on_hand = -1 OR reserved <= on_hand))
);
INSERT INTO skus_new (sku, on_hand, per_user_limit, created_at, updated_at)
  SELECT sku, stock, per_user_limit, created_at, updated_at FROM skus;
DROP TABLE skus;
ALTER TABLE skus_new RENAME TO skus;

-- +goose Down
CREATE TABLE skus_old (
  sku            TEXT     NOT NULL PRIMARY KEY,
  stock          INTEGER  NOT NULL CHECK (stock >= -1),
  per_user_limit INTEGER  NOT NULL DEFAULT 0 CHECK (per_user_limit >= 0),
  created_at     DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at     DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP
);
INSERT INTO skus_old (sku, stock, per_user_limit, created_at, updated_at)
  SELECT sku, on_hand, per_user_limit, created_at, updated_at FROM skus;
DROP TABLE skus;
ALTER TABLE skus_old RENAME TO skus;
