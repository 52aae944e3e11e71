-- The quantity states of SPEC section 3. on_hand is what is physically there
-- (the old stock column: the ordered MQ deducts it on payment), reserved is
-- what live reservations promise, available = on_hand - reserved. The CHECK
-- makes the database refuse an oversell, whatever Redis says. seq counts the
-- changes of available (it fences Redis give-backs against a re-init), and
-- redis_epoch numbers the Redis initialisations of the SKU.
-- +goose Up
ALTER TABLE skus DROP CONSTRAINT skus_stock_valid;
ALTER TABLE skus RENAME COLUMN stock TO on_hand,
  ADD COLUMN reserved    BIGINT NOT NULL DEFAULT 0 AFTER on_hand,
  ADD COLUMN seq         BIGINT NOT NULL DEFAULT 0 AFTER reserved,
  ADD COLUMN redis_epoch BIGINT NOT NULL DEFAULT 0 AFTER seq;
UPDATE skus s SET reserved = (SELECT COALESCE(SUM(r.qty), 0) FROM stock_reservations r
  WHERE r.sku = s.sku AND r.state IN ('HELD', 'COMMITTED'));
ALTER TABLE skus
  ADD CONSTRAINT skus_on_hand_valid CHECK (on_hand >= -1),
  ADD CONSTRAINT skus_reserved_valid CHECK (reserved >= 0 AND (on_hand = -1 OR reserved <= on_hand));

-- +goose Down
ALTER TABLE skus DROP CONSTRAINT skus_reserved_valid, DROP CONSTRAINT skus_on_hand_valid;
ALTER TABLE skus DROP COLUMN redis_epoch, DROP COLUMN seq, DROP COLUMN reserved,
  RENAME COLUMN on_hand TO stock;
ALTER TABLE skus ADD CONSTRAINT skus_stock_valid CHECK (stock >= -1);
