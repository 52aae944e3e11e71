-- +goose Up
SELECT 1;

-- +goose Down
SELECT 1;
