-- What of a SKU's holds is left to project (issue 43): the sale's UPDATE
-- sets holds_dirty and hold_seq (its last hold's seq); the projector
-- writes the holds past projected_seq, moves it, and clears the flag once
-- hold_seq is reached. Added INSTANT and indexed LOCK=NONE under a
-- serving fleet (MariaDB refuses rather than copy the table).
-- +goose Up
ALTER TABLE skus ADD COLUMN holds_dirty TINYINT NOT NULL DEFAULT 0,
  ADD COLUMN hold_seq BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN projected_seq BIGINT NOT NULL DEFAULT 0, ALGORITHM=INSTANT;
ALTER TABLE skus ADD KEY skus_holds_dirty (holds_dirty), ALGORITHM=INPLACE, LOCK=NONE;

-- +goose Down
ALTER TABLE skus DROP KEY skus_holds_dirty;
ALTER TABLE skus DROP COLUMN projected_seq, DROP COLUMN hold_seq, DROP COLUMN holds_dirty;
