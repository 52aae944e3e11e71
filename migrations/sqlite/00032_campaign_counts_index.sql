-- The embedded default's copy of mysql/00032.
-- +goose Up
DROP INDEX stock_reservations_campaign;
CREATE INDEX stock_reservations_campaign ON stock_reservations (campaign_id, state, qty);

-- +goose Down
DROP INDEX stock_reservations_campaign;
CREATE INDEX stock_reservations_campaign ON stock_reservations (campaign_id, state);
