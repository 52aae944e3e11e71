-- Stock counts (docs/design.md "Counts are rebased"): one row per count a
-- warehouse or ERP sent (POST /v1/stock/counts), named by the client's
-- count_id. counted_at is when the units were counted: every line of the
-- count is rebased to it. A count may come in several requests (pages,
-- stock_count_pages); they must all say the same counted_at. Never pruned:
-- it is what makes a replay of the count change nothing.
-- +goose Up
CREATE TABLE stock_counts (
  count_id   VARCHAR(64) NOT NULL PRIMARY KEY,
  counted_at DATETIME(6) NOT NULL,
  created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE stock_counts;
