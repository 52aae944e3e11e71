-- Stock events (docs/design.md "Stock events"): what a change of a SKU's
-- quantities means to a storefront. A threshold event (sold out, back in
-- stock, low stock) is written by the arbiter in the transaction of the
-- change that crosses the threshold; sku.level_changed by the one-node
-- events job, at most once per SKU per second. The levels are the
-- database's as that transaction left them.
-- row_id is the order the rows were written in. id is the event's place
-- in the replay feed, NULL until the events job publishes it: it numbers
-- committed rows in the order it finds them, so a reader paging by id
-- never passes over an event that committed late. seq numbers a SKU's
-- events with no gap (skus.event_seq is the last one, under the SKU's
-- row lock). campaign_id names the campaign of a campaign event.
-- +goose Up
CREATE TABLE stock_events (
  row_id      BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
  id          BIGINT      NULL,
  type        VARCHAR(32) NOT NULL,
  sku         VARCHAR(64) NOT NULL,
  seq         BIGINT      NOT NULL,
  campaign_id VARCHAR(64) NULL,
  occurred_at DATETIME(6) NOT NULL,
  on_hand     BIGINT      NOT NULL,
  reserved    BIGINT      NOT NULL,
  available   BIGINT      NOT NULL,
  UNIQUE KEY stock_events_id (id),
  UNIQUE KEY stock_events_sku_seq (sku, seq),
  KEY stock_events_sku_id (sku, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE stock_events;
