-- What of a campaign's holds is left to project (issue 43): the lean
-- sale records a campaign's holds as rows of holds numbered by the
-- pool's own change counter (its reservation's result, moved under the
-- pool's row lock, the only row a campaign's sale locks), so neither the
-- SKU's hot row nor the campaign's is written by a sale. A campaign is
-- dirty from its creation (the default, for rows an older release
-- creates too) until the projector has projected past the pool's last
-- change once the pool is released (no sale can follow); projected_seq
-- is its cursor. Added INSTANT and indexed LOCK=NONE under a serving
-- fleet.
-- +goose Up
ALTER TABLE campaigns ADD COLUMN holds_dirty TINYINT NOT NULL DEFAULT 1,
  ADD COLUMN projected_seq BIGINT NOT NULL DEFAULT 0, ALGORITHM=INSTANT;
ALTER TABLE campaigns ADD KEY campaigns_holds_dirty (holds_dirty), ALGORITHM=INPLACE, LOCK=NONE;

-- +goose Down
ALTER TABLE campaigns DROP KEY campaigns_holds_dirty;
ALTER TABLE campaigns DROP COLUMN projected_seq, DROP COLUMN holds_dirty;
