-- Names are exact, byte for byte. SQLite compares text with BINARY by
-- default, so the embedded database always did; on MySQL migration 18
-- converts the tables to utf8mb4_bin (migrations/exact.go).
-- +goose Up
SELECT 1;

-- +goose Down
SELECT 1;
