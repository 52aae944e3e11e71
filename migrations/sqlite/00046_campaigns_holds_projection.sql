-- The embedded default's copy of mysql/00046.
-- +goose Up
ALTER TABLE campaigns ADD COLUMN holds_dirty INTEGER NOT NULL DEFAULT 1;
ALTER TABLE campaigns ADD COLUMN projected_seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX campaigns_holds_dirty ON campaigns (holds_dirty);

-- +goose Down
DROP INDEX campaigns_holds_dirty;
ALTER TABLE campaigns DROP COLUMN projected_seq;
ALTER TABLE campaigns DROP COLUMN holds_dirty;
