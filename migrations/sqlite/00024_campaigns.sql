-- The embedded default's copy of mysql/00024.
-- +goose Up
CREATE TABLE campaigns (
  id             TEXT     NOT NULL PRIMARY KEY,
  sku            TEXT     NOT NULL,
  allotment      INTEGER  NOT NULL CHECK (allotment > 0),
  starts_at      DATETIME NOT NULL,
  ends_at        DATETIME NOT NULL,
  per_user_limit INTEGER  NOT NULL DEFAULT 0 CHECK (per_user_limit >= 0),
  hold_seconds   INTEGER  NOT NULL DEFAULT 0 CHECK (hold_seconds >= 0),
  redis_epoch    INTEGER  NOT NULL DEFAULT 0,
  rev            INTEGER  NOT NULL DEFAULT 1,
  created_at     DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at     DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  CHECK (ends_at > starts_at)
);
CREATE INDEX campaigns_sku_window ON campaigns (sku, starts_at);

-- +goose Down
DROP TABLE campaigns;
