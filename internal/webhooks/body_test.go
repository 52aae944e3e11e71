package webhooks_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/webhooks"
)

// feedJSON is an event as the replay feed encodes it.
func feedJSON(t *testing.T, v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(v))
	return buf.String()
}

// A webhook's body is the replay feed's object for the event, byte for
// byte, a SKU's event and a campaign's alike; the record's row id stays
// out of both.
func TestBodyIsTheFeedsObject(t *testing.T) {
	id, campaign := int64(42), "SPRING<&>"
	at := time.Date(2026, 11, 28, 10, 0, 0, 123456000, time.UTC)
	for name, e := range map[string]arbiter.Event{
		"sku":         {RowID: 7, ID: &id, Type: arbiter.EventSoldOut, SKU: "A<&>B", Seq: 3, OccurredAt: at, OnHand: 5, Reserved: 5},
		"campaign":    {RowID: 8, ID: &id, Type: arbiter.EventCampaignStarted, SKU: "C", Seq: 1, CampaignID: &campaign, OccurredAt: at, OnHand: 9, Reserved: 2, Available: 7},
		"unlimited":   {RowID: 9, ID: &id, Type: arbiter.EventBackInStock, SKU: "U", Seq: 2, OccurredAt: at, OnHand: -1, Available: -1},
		"unpublished": {RowID: 10, Type: arbiter.EventLevelChanged, SKU: "N", Seq: 1, OccurredAt: at},
	} {
		require.Equal(t, feedJSON(t, e), feedJSON(t, webhooks.BodyOf(e)), name)
	}
	// Every field of the record but its row id is in the body: a field
	// added to the record fails here until the body decides about it.
	var fields []string
	for f := range reflect.TypeFor[arbiter.Event]().Fields() {
		if f.Name != "RowID" {
			fields = append(fields, f.Name)
		}
	}
	var body []string
	for f := range reflect.TypeFor[webhooks.Body]().Fields() {
		body = append(body, f.Name)
	}
	require.Equal(t, fields, body)
}
