-- A count's lines as applied, a batch of up to 1,000 lines per row, each
-- written in the transaction that applied its lines (their COUNT
-- movements, their shortages): so a batch applies once however many times
-- its request is sent, and a replay is answered from these rows as the
-- first request was. first_line numbers the batch's first line in the
-- count (from 1, across its pages); outcomes holds each line's outcome
-- (JSON: line, sku, counted, unshipped and where it came from, outcome,
-- on_hand as of counted_at, correction, applied, short, on_hand after);
-- the counters sum them for the count's progress. Never pruned.
-- +goose Up
CREATE TABLE stock_count_batches (
  count_id      VARCHAR(64) NOT NULL,
  first_line    INT         NOT NULL,
  line_count    INT         NOT NULL,
  corrected     INT         NOT NULL,
  unchanged     INT         NOT NULL,
  short         INT         NOT NULL,
  unknown       INT         NOT NULL,
  unlimited     INT         NOT NULL,
  superseded    INT         NOT NULL,
  units_added   BIGINT      NOT NULL,
  units_removed BIGINT      NOT NULL,
  units_short   BIGINT      NOT NULL,
  outcomes      MEDIUMBLOB  NOT NULL,
  created_at    DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (count_id, first_line)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE stock_count_batches;
