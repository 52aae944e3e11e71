-- The durable stock record. stock = -1 means unlimited.
-- +goose Up
CREATE TABLE skus (
  sku            VARCHAR(64)  NOT NULL PRIMARY KEY,
  stock          BIGINT       NOT NULL,
  per_user_limit INT          NOT NULL DEFAULT 0,
  created_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  CONSTRAINT skus_stock_valid CHECK (stock >= -1),
  CONSTRAINT skus_limit_valid CHECK (per_user_limit >= 0)
) ENGINE=InnoDB;

-- +goose Down
DROP TABLE skus;
