-- Retention deletes numbered stock events older than its events horizon
-- (INVENTORY_EVENT_RETENTION) by occurred_at: the index finds them without
-- reading the events it keeps. (A migration of its own, not a change of
-- 00026, so a database migrated with 00026 gets it.)
-- +goose Up
ALTER TABLE stock_events ADD KEY stock_events_occurred (occurred_at);

-- +goose Down
ALTER TABLE stock_events DROP KEY stock_events_occurred;
