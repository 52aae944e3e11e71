-- A flash-sale campaign: a window [starts_at, ends_at) and an allotment of
-- one SKU. Its unsold units are one reservation row of the SKU (the pool,
-- token 'c:' + id, in stock_reservations), so the SKU's reserved counts
-- them and regular sales can never take them; the CHECK and reconcile stay
-- as they are. The pool's row counts its changes in its result column (the
-- fence of its Redis copy); redis_epoch numbers the Redis initialisations
-- of the pool, as skus.redis_epoch does a SKU's. rev is the version an
-- admin's If-Match names.
-- +goose Up
CREATE TABLE campaigns (
  id             VARCHAR(64) NOT NULL,
  sku            VARCHAR(64) NOT NULL,
  allotment      BIGINT      NOT NULL,
  starts_at      DATETIME(6) NOT NULL,
  ends_at        DATETIME(6) NOT NULL,
  per_user_limit BIGINT      NOT NULL DEFAULT 0,
  hold_seconds   INT         NOT NULL DEFAULT 0,
  redis_epoch    BIGINT      NOT NULL DEFAULT 0,
  rev            BIGINT      NOT NULL DEFAULT 1,
  created_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  KEY campaigns_sku_window (sku, starts_at),
  CONSTRAINT campaigns_allotment_valid CHECK (allotment > 0),
  CONSTRAINT campaigns_window_valid CHECK (ends_at > starts_at),
  CONSTRAINT campaigns_limit_valid CHECK (per_user_limit >= 0),
  CONSTRAINT campaigns_hold_valid CHECK (hold_seconds >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE campaigns;
