-- The embedded default's copy of mysql/00034.
-- +goose Up
CREATE TABLE stock_counts (
  count_id   TEXT     NOT NULL PRIMARY KEY,
  counted_at DATETIME NOT NULL,
  created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP
);

-- +goose Down
DROP TABLE stock_counts;
