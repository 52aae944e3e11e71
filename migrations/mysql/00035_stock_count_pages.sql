-- The requests a count came in: lines first_line+1 .. first_line+line_count of
-- the count, and the SHA-256 of what the request said (counted_at, the
-- offset and its lines), so a replay is told from another body under the
-- same count_id (409). Pages of one count never overlap.
-- +goose Up
CREATE TABLE stock_count_pages (
  count_id   VARCHAR(64) NOT NULL,
  first_line INT         NOT NULL,
  line_count INT         NOT NULL,
  body_hash  CHAR(64)    NOT NULL,
  created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (count_id, first_line),
  CONSTRAINT stock_count_pages_lines_valid CHECK (line_count > 0 AND first_line >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE stock_count_pages;
