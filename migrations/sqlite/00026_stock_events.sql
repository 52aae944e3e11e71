-- The embedded default's copy of mysql/00026.
-- +goose Up
CREATE TABLE stock_events (
  row_id      INTEGER  NOT NULL PRIMARY KEY AUTOINCREMENT,
  id          INTEGER  NULL,
  type        TEXT     NOT NULL,
  sku         TEXT     NOT NULL,
  seq         INTEGER  NOT NULL,
  campaign_id TEXT     NULL,
  occurred_at DATETIME NOT NULL,
  on_hand     INTEGER  NOT NULL,
  reserved    INTEGER  NOT NULL,
  available   INTEGER  NOT NULL,
  UNIQUE (id),
  UNIQUE (sku, seq)
);
CREATE INDEX stock_events_sku_id ON stock_events (sku, id);

-- +goose Down
DROP TABLE stock_events;
