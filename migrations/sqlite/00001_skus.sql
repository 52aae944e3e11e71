-- The embedded default's copy of mysql/00001 (same tables and rules, SQLite syntax).
-- +goose Up
CREATE TABLE skus (
  sku            TEXT     NOT NULL PRIMARY KEY,
  stock          INTEGER  NOT NULL CHECK (stock >= -1),
  per_user_limit INTEGER  NOT NULL DEFAULT 0 CHECK (per_user_limit >= 0),
  created_at     DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at     DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP
);

-- +goose Down
DROP TABLE skus;
