-- The lean sale (issue 43, docs/design.md "The lean sale"): the sale's
-- record of each hold, written once in the sale's commit and never
-- changed; the order, its reservations and the RESERVE movement are its
-- projection, written after it (internal/projection). Two index entries
-- per hold: the primary key, and the SKU's holds in commit order.
-- id: an order's UUIDv7 as 16 bytes (line numbers its lines), or a
-- token hold's first 16 bytes of SHA-256 of its SKU and token (name is
-- the token, compared on every lookup). buyer: the order's user; quota: 1
-- when the buyer's per-user quota counted the hold (its release gives it
-- back). sku_id: the first 8 bytes of
-- SHA-256 of sku, as a signed integer (readers filter on sku). seq: the
-- hold's position in its SKU's movements, assigned under the SKU's row
-- lock. A row of no units and seq 0 is a release's tombstone of a token
-- never seen (arbiter.Tombstone): a later hold under the key collides with
-- it. A new table: nothing that serves waits for it.
-- +goose Up
CREATE TABLE holds (
  id          BINARY(16)       NOT NULL,
  line        TINYINT UNSIGNED NOT NULL,
  sku_id      BIGINT           NOT NULL,
  seq         BIGINT           NOT NULL,
  sku         VARCHAR(64)      NOT NULL,
  qty         INT              NOT NULL,
  result      BIGINT           NOT NULL,
  name        VARCHAR(140)     NULL,
  buyer       VARCHAR(64)      NULL,
  quota       TINYINT          NOT NULL DEFAULT 0,
  campaign_id VARCHAR(64)      NULL,
  deadline    DATETIME(6)      NOT NULL,
  created_at  DATETIME(6)      NOT NULL,
  PRIMARY KEY (id, line),
  KEY holds_sku_seq (sku_id, seq),
  CONSTRAINT holds_qty_valid CHECK (qty >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE holds;
