-- The embedded default's copy of mysql/00025.
-- +goose Up
ALTER TABLE stock_reservations ADD COLUMN campaign_id TEXT NULL;
CREATE INDEX stock_reservations_campaign ON stock_reservations (campaign_id, state);

-- +goose Down
DROP INDEX stock_reservations_campaign;
ALTER TABLE stock_reservations DROP COLUMN campaign_id;
