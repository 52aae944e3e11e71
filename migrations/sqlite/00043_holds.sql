-- The embedded default's copy of mysql/00043.
-- +goose Up
CREATE TABLE holds (
  id          BLOB    NOT NULL,
  line        INTEGER NOT NULL,
  sku_id      INTEGER NOT NULL,
  seq         INTEGER NOT NULL,
  sku         TEXT    NOT NULL,
  qty         INTEGER NOT NULL CHECK (qty >= 0),
  result      INTEGER NOT NULL,
  name        TEXT    NULL,
  buyer       TEXT    NULL,
  quota       INTEGER NOT NULL DEFAULT 0,
  campaign_id TEXT    NULL,
  deadline    DATETIME NOT NULL,
  created_at  DATETIME NOT NULL,
  PRIMARY KEY (id, line)
);
CREATE INDEX holds_sku_seq ON holds (sku_id, seq);

-- +goose Down
DROP TABLE holds;
