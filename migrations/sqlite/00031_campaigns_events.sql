-- The embedded default's copy of mysql/00030 (its database starts empty
-- with every run: no campaign to mark as announced).
-- +goose Up
ALTER TABLE campaigns ADD COLUMN event_flags INTEGER NOT NULL DEFAULT 0;
CREATE INDEX campaigns_opening ON campaigns (event_flags, starts_at);
CREATE INDEX campaigns_closing ON campaigns (event_flags, ends_at);

-- +goose Down
DROP INDEX campaigns_closing;
DROP INDEX campaigns_opening;
ALTER TABLE campaigns DROP COLUMN event_flags;
