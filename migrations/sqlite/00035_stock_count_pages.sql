-- The embedded default's copy of mysql/00035.
-- +goose Up
CREATE TABLE stock_count_pages (
  count_id   TEXT     NOT NULL,
  first_line INTEGER  NOT NULL,
  line_count INTEGER  NOT NULL,
  body_hash  TEXT     NOT NULL,
  created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (count_id, first_line),
  CHECK (line_count > 0 AND first_line >= 0)
);

-- +goose Down
DROP TABLE stock_count_pages;
