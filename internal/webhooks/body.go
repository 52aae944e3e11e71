package webhooks

import (
	"time"

	"github.com/acme/inventory/internal/arbiter"
)

// Body is what a delivery sends for one stock event (docs/api.md,
// "Webhooks"): the replay feed's object, field for field, so a receiver
// reads both alike. It is its own type, not the table's record, so a
// column added to stock_events does not reach receivers unannounced.
type Body struct {
	ID         *int64    `json:"id"`
	Type       string    `json:"type"`
	SKU        string    `json:"sku"`
	Seq        int64     `json:"seq"`
	CampaignID *string   `json:"campaign_id,omitempty"` // a campaign's events only
	OccurredAt time.Time `json:"occurred_at"`
	OnHand     int64     `json:"on_hand"`
	Reserved   int64     `json:"reserved"`
	Available  int64     `json:"available"` // -1: unlimited
	// Short and CountID are a sku.shortage's: the units a stock count
	// could not take, and the count.
	Short   *int64  `json:"short,omitempty"`
	CountID *string `json:"count_id,omitempty"`
}

// BodyOf is the body of e's delivery.
func BodyOf(e arbiter.Event) Body {
	return Body{ID: e.ID, Type: e.Type, SKU: e.SKU, Seq: e.Seq, CampaignID: e.CampaignID,
		OccurredAt: e.OccurredAt, OnHand: e.OnHand, Reserved: e.Reserved, Available: e.Available,
		Short: e.Short, CountID: e.CountID}
}
