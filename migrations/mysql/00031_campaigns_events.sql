-- What a campaign's events announced (docs/design.md "Stock events"):
-- event_flags 1 campaign.started, 2 campaign.sold_out (cleared by
-- campaign.back_in_stock), 4 campaign.ended. Each is set by a conditional
-- UPDATE in the transaction that writes its event, so a campaign announces
-- each once however many nodes race to (a sale, the end route, the
-- timeout sweep, the events job). The two keys let the events job find
-- the campaigns the database's clock opened or closed and nothing
-- announced yet without reading the others.
-- A campaign that opened, sold out or ended before this migration counts
-- as announced: no event for what was already so.
-- (Migration 29 is the webhooks' on their branch.)
-- +goose Up
ALTER TABLE campaigns
  ADD COLUMN event_flags TINYINT NOT NULL DEFAULT 0,
  ADD KEY campaigns_opening (event_flags, starts_at),
  ADD KEY campaigns_closing (event_flags, ends_at);
UPDATE campaigns c JOIN stock_reservations p ON p.token = CONCAT('c:', c.id)
  SET c.event_flags = CASE
    WHEN p.state <> 'HELD' OR c.ends_at <= UTC_TIMESTAMP(6) THEN 5
    WHEN c.starts_at > UTC_TIMESTAMP(6) THEN 0
    WHEN p.qty = 0 THEN 3
    ELSE 1 END;

-- +goose Down
ALTER TABLE campaigns DROP KEY campaigns_closing, DROP KEY campaigns_opening, DROP COLUMN event_flags;
