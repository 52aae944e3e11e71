-- The embedded default's copy of mysql/00029.
-- +goose Up
CREATE TABLE webhooks (
  id              TEXT     NOT NULL PRIMARY KEY,
  url             TEXT     NOT NULL,
  secret          TEXT     NOT NULL,
  events          TEXT     NOT NULL,
  skus            TEXT     NOT NULL,
  state           TEXT     NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'failing')),
  delivered_id    INTEGER  NOT NULL DEFAULT 0,
  last_success_at DATETIME NULL,
  last_error      TEXT     NULL,
  last_error_at   DATETIME NULL,
  created_at      DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at      DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP
);

-- +goose Down
DROP TABLE webhooks;
