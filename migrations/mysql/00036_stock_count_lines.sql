-- One row per line of a count, written in the transaction that applied it
-- (its COUNT movement, its shortage), so a line applies once however many
-- times its request is sent, and a replay is answered from these rows as
-- the first request was. line numbers the count's lines from 1 across its
-- pages. on_hand_then is on_hand as of counted_at (NULL when nothing was
-- applied: an unknown SKU, an unlimited one, a line a later count
-- superseded); correction = counted - unshipped - on_hand_then; applied is
-- what on_hand moved (the correction, or less when it would have gone
-- below reserved: short is the rest); on_hand is on_hand after the line.
-- unshipped_given says whether the line said unshipped (else the service
-- computed it from the shipped signal). Never pruned.
-- +goose Up
CREATE TABLE stock_count_lines (
  count_id        VARCHAR(64) NOT NULL,
  line            INT         NOT NULL,
  sku             VARCHAR(64) NOT NULL,
  counted         BIGINT      NOT NULL,
  unshipped       BIGINT      NOT NULL,
  unshipped_given TINYINT     NOT NULL,
  outcome         VARCHAR(16) NOT NULL,
  on_hand_then    BIGINT      NULL,
  correction      BIGINT      NOT NULL DEFAULT 0,
  applied         BIGINT      NOT NULL DEFAULT 0,
  short           BIGINT      NOT NULL DEFAULT 0,
  on_hand         BIGINT      NULL,
  created_at      DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (count_id, line),
  CONSTRAINT stock_count_lines_outcome_valid
    CHECK (outcome IN ('corrected', 'unchanged', 'short', 'unknown', 'unlimited', 'superseded'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE stock_count_lines;
