package httpapi_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/identity"
)

// A campaign's events through the API on the embedded default: buyers
// racing through the buy route for more units than the campaign has, a
// cancel that brings one back, the end route; the replay feed (its answers
// checked against the document, whose enum names the campaign events)
// has them once each, with the campaign's id, in the SKU's seq order.
func TestCampaignEventsThroughTheAPI(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	now := time.Now().UTC()
	code, body := call(t, h, "PUT", "/v1/skus/CAMP-EV", `{"stock":50}`, admin...)
	require.Equal(t, 200, code, body)
	code, body = call(t, h, "PUT", "/v1/campaigns/ev1", fmt.Sprintf(`{"sku":"CAMP-EV","allotment":5,"starts_at":%q,"ends_at":%q}`,
		now.Add(-time.Second).Format(time.RFC3339Nano), now.Add(time.Hour).Format(time.RFC3339Nano)), admin...)
	require.Equal(t, 200, code, body)

	var mu sync.Mutex
	var orders []string
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("buyer%d", i)
			code, body := call(t, h, "POST", "/v1/campaigns/ev1/buy", "", identity.Header, buyerToken(t, a, user))
			if code == 201 {
				mu.Lock()
				orders = append(orders, orderAns(t, body).ID+" "+user)
				mu.Unlock()
			} else if code != 409 {
				t.Errorf("buyer %d: %d %s", i, code, body)
			}
		}()
	}
	wg.Wait()
	require.Len(t, orders, 5)
	var id, user string
	_, err := fmt.Sscan(orders[0], &id, &user)
	require.NoError(t, err)
	code, body = call(t, h, "POST", "/v1/orders/"+id+"/cancel", "", identity.Header, buyerToken(t, a, user))
	require.Equal(t, 200, code, body)
	code, body = call(t, h, "POST", "/v1/campaigns/ev1/end", "", admin...)
	require.Equal(t, 200, code, body)

	want := []string{"ev1 campaign.started", "ev1 campaign.sold_out", "ev1 campaign.back_in_stock", "ev1 campaign.ended"}
	var got []arbiter.Event
	require.Eventually(t, func() bool {
		code, body := call(t, h, "GET", "/v1/events?sku=CAMP-EV&limit=500", "")
		require.Equal(t, 200, code, body)
		var p struct{ Items []arbiter.Event }
		require.NoError(t, json.Unmarshal([]byte(body), &p))
		got = p.Items
		var campaigns []string
		for _, e := range got {
			if e.CampaignID != nil {
				campaigns = append(campaigns, *e.CampaignID+" "+e.Type)
			}
		}
		return slices.Equal(want, campaigns)
	}, 5*time.Second, 20*time.Millisecond, "the feed has the campaign's events once each")
	for i, e := range got {
		require.EqualValues(t, i+1, e.Seq, "the SKU's and its campaign's events in one seq order")
	}
}
