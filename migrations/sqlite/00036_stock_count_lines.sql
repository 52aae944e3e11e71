-- The embedded default's copy of mysql/00036.
-- +goose Up
CREATE TABLE stock_count_lines (
  count_id        TEXT     NOT NULL,
  line            INTEGER  NOT NULL,
  sku             TEXT     NOT NULL,
  counted         INTEGER  NOT NULL,
  unshipped       INTEGER  NOT NULL,
  unshipped_given INTEGER  NOT NULL,
  outcome         TEXT     NOT NULL
    CHECK (outcome IN ('corrected', 'unchanged', 'short', 'unknown', 'unlimited', 'superseded')),
  on_hand_then    INTEGER  NULL,
  correction      INTEGER  NOT NULL DEFAULT 0,
  applied         INTEGER  NOT NULL DEFAULT 0,
  short           INTEGER  NOT NULL DEFAULT 0,
  on_hand         INTEGER  NULL,
  created_at      DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (count_id, line)
);

-- +goose Down
DROP TABLE stock_count_lines;
