-- A campaign's counts (its view: GET /v1/campaigns/{id}, which each node
-- reads again at most every 500 ms while product pages poll) are summed
-- from this index alone: with qty in it, counting a sale reads no row.
-- At 25,000 sales the count took 78 ms on a quiet MariaDB, 15 ms with it.
-- +goose Up
ALTER TABLE stock_reservations DROP KEY stock_reservations_campaign,
  ADD KEY stock_reservations_campaign (campaign_id, state, qty);

-- +goose Down
ALTER TABLE stock_reservations DROP KEY stock_reservations_campaign,
  ADD KEY stock_reservations_campaign (campaign_id, state);
