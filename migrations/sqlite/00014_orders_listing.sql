-- The embedded default's copy of mysql/00014: the order listing's indexes.
-- +goose Up
CREATE INDEX orders_user_id ON orders (user_id, id);
CREATE INDEX orders_status_id ON orders (status, id);
CREATE INDEX orders_created_id ON orders (created_at, id);

-- +goose Down
DROP INDEX orders_created_id;
DROP INDEX orders_status_id;
DROP INDEX orders_user_id;
