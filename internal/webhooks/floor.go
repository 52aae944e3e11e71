package webhooks

import (
	"context"

	"gorm.io/gorm"
)

// Floor is the lowest feed id a subscription was delivered up to, and
// whether there is a subscription at all: retention keeps every event
// above it (a subscription's cursor only grows, and a new one starts at
// the head, so a floor read once holds for a whole run).
// It reads db (retention runs it on its own handle).
func Floor(ctx context.Context, db *gorm.DB) (floor int64, any bool, err error) {
	var f struct {
		Floor int64
		N     int64
	}
	err = db.WithContext(ctx).Raw(`SELECT COALESCE(MIN(delivered_id), 0) AS floor, COUNT(*) AS n FROM webhooks`).Scan(&f).Error
	return f.Floor, f.N > 0, err
}
