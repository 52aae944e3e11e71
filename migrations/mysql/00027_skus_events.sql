-- What the stock events need of a SKU, on its row (read and written under
-- its lock by the arbiter, so concurrent changes decide each crossing
-- once): low_stock_threshold (0: no sku.low_stock), event_flags the
-- thresholds the last events announced (1 low, 2 sold out), event_seq the
-- seq of the SKU's last event, level_dirty whether on_hand or reserved
-- moved since the last sku.level_changed (set by the statements that move
-- them; the index changes only when it flips, so the events job finds
-- these SKUs without reading the others), level_at when that last one was.
-- A SKU sold out now counts as announced: no event for what was already so.
-- +goose Up
ALTER TABLE skus
  ADD COLUMN low_stock_threshold BIGINT      NOT NULL DEFAULT 0,
  ADD COLUMN event_flags         TINYINT     NOT NULL DEFAULT 0,
  ADD COLUMN event_seq           BIGINT      NOT NULL DEFAULT 0,
  ADD COLUMN level_dirty         TINYINT     NOT NULL DEFAULT 0,
  ADD COLUMN level_at            DATETIME(6) NULL,
  ADD KEY skus_level_dirty (level_dirty),
  ADD CONSTRAINT skus_low_stock_threshold_valid CHECK (low_stock_threshold >= 0);
UPDATE skus SET event_flags = 2 WHERE on_hand <> -1 AND on_hand - reserved <= 0;

-- +goose Down
ALTER TABLE skus DROP CONSTRAINT skus_low_stock_threshold_valid, DROP KEY skus_level_dirty,
  DROP COLUMN level_at, DROP COLUMN level_dirty, DROP COLUMN event_seq, DROP COLUMN event_flags,
  DROP COLUMN low_stock_threshold;
