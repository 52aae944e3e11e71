-- The embedded default's copy of mysql/00045.
-- +goose Up
ALTER TABLE skus ADD COLUMN holds_dirty INTEGER NOT NULL DEFAULT 0;
ALTER TABLE skus ADD COLUMN hold_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE skus ADD COLUMN projected_seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX skus_holds_dirty ON skus (holds_dirty);

-- +goose Down
DROP INDEX skus_holds_dirty;
ALTER TABLE skus DROP COLUMN projected_seq;
ALTER TABLE skus DROP COLUMN hold_seq;
ALTER TABLE skus DROP COLUMN holds_dirty;
