-- A count's correction is a movement of its own kind, COUNT, referenced
-- "count:<count_id>:<line>".
-- +goose Up
ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_kind_valid;
ALTER TABLE stock_movements ADD CONSTRAINT stock_movements_kind_valid
  CHECK (kind IN ('RESERVE', 'RELEASE', 'SALE', 'RESTOCK', 'CORRECTION', 'REFUND', 'SET', 'COUNT'));

-- +goose Down
UPDATE stock_movements SET kind = 'CORRECTION' WHERE kind = 'COUNT';
ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_kind_valid;
ALTER TABLE stock_movements ADD CONSTRAINT stock_movements_kind_valid
  CHECK (kind IN ('RESERVE', 'RELEASE', 'SALE', 'RESTOCK', 'CORRECTION', 'REFUND', 'SET'));
