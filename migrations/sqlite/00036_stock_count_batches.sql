-- The embedded default's copy of mysql/00036.
-- +goose Up
CREATE TABLE stock_count_batches (
  count_id      TEXT     NOT NULL,
  first_line    INTEGER  NOT NULL,
  line_count    INTEGER  NOT NULL,
  corrected     INTEGER  NOT NULL,
  unchanged     INTEGER  NOT NULL,
  short         INTEGER  NOT NULL,
  unknown       INTEGER  NOT NULL,
  unlimited     INTEGER  NOT NULL,
  superseded    INTEGER  NOT NULL,
  units_added   INTEGER  NOT NULL,
  units_removed INTEGER  NOT NULL,
  units_short   INTEGER  NOT NULL,
  outcomes      BLOB     NOT NULL,
  created_at    DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (count_id, first_line)
);

-- +goose Down
DROP TABLE stock_count_batches;
