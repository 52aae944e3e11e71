-- The embedded default's copy of mysql/00028.
-- +goose Up
CREATE INDEX stock_events_occurred ON stock_events (occurred_at);

-- +goose Down
DROP INDEX stock_events_occurred;
