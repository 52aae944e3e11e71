-- An order's reservation taken from a campaign's pool names the campaign:
-- released while the campaign runs, its units go back to the pool; after
-- the end, to the SKU. The index answers a campaign's sold and held counts.
-- NULL for every reservation made outside a campaign (and all earlier ones).
-- +goose Up
ALTER TABLE stock_reservations ADD COLUMN campaign_id VARCHAR(64) NULL,
  ADD KEY stock_reservations_campaign (campaign_id, state);

-- +goose Down
ALTER TABLE stock_reservations DROP KEY stock_reservations_campaign, DROP COLUMN campaign_id;
