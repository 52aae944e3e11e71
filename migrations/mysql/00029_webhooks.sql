-- Webhook subscriptions (docs/design.md "Stock events"): where an operator
-- wants stock events delivered. events and skus are JSON arrays (skus
-- empty: every SKU). secret signs each delivery; it is never answered or
-- logged. delivered_id is the feed id up to which the subscription's
-- events were delivered (set to the feed's head when it is created: it
-- starts with the events that follow); state is active or failing, and a
-- failing one keeps its backlog (nothing is ever deleted for failing).
-- +goose Up
CREATE TABLE webhooks (
  id              VARCHAR(64)   NOT NULL PRIMARY KEY,
  url             VARCHAR(2048) NOT NULL,
  secret          VARCHAR(255)  NOT NULL,
  events          VARCHAR(1024) NOT NULL,
  skus            MEDIUMTEXT    NOT NULL,
  state           VARCHAR(16)   NOT NULL DEFAULT 'active',
  delivered_id    BIGINT        NOT NULL DEFAULT 0,
  last_success_at DATETIME(6)   NULL,
  last_error      VARCHAR(1024) NULL,
  last_error_at   DATETIME(6)   NULL,
  created_at      DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at      DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  CONSTRAINT webhooks_state_valid CHECK (state IN ('active', 'failing'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE webhooks;
