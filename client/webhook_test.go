package client_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/client"
)

var hookSecret = []byte("0123456789abcdef0123456789abcdef")

const hookBody = `{"id":42,"type":"campaign.sold_out","sku":"DEMO-PHONE","seq":3,"campaign_id":"spring",` +
	`"occurred_at":"2026-11-26T18:00:00.123456Z","on_hand":10,"reserved":10,"available":0}`

// signed is a delivery as the service sends it: X-Timestamp (unix seconds)
// and X-Signature = hex HMAC-SHA256(secret, timestamp + "." + body), the
// event id in X-Event-Id.
func signed(secret []byte, at time.Time, body, id string) http.Header {
	ts := strconv.FormatInt(at.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "." + body))
	h := http.Header{}
	h.Set("X-Timestamp", ts)
	h.Set("X-Signature", hex.EncodeToString(mac.Sum(nil)))
	h.Set("X-Event-Id", id)
	return h
}

// Each way a delivery can be wrong is refused with its reason, and
// nothing of its body is returned: a tampered body, another secret, a
// timestamp outside the tolerance either way, a missing or malformed
// header, an X-Event-Id that is not the signed event's, a signed body
// that is not an event.
func TestVerifyWebhook(t *testing.T) {
	now := time.Date(2026, 11, 26, 18, 0, 1, 0, time.UTC)
	ev, err := client.VerifyWebhook(hookSecret, signed(hookSecret, now, hookBody, "42"), []byte(hookBody), now, 0)
	require.NoError(t, err)
	require.Equal(t, int64(42), ev.Id)
	require.Equal(t, client.StockEventType("campaign.sold_out"), ev.Type)
	require.Equal(t, "spring", *ev.CampaignId)
	require.Equal(t, [4]int64{3, 10, 10, 0}, [4]int64{ev.Seq, ev.OnHand, ev.Reserved, ev.Available})

	_, err = client.VerifyWebhook(hookSecret, signed(hookSecret, now.Add(-4*time.Minute), hookBody, "42"), []byte(hookBody), now, 0)
	require.NoError(t, err, "within the default 5 minutes")

	for _, c := range []struct {
		what      string
		header    http.Header
		body      string
		tolerance time.Duration
		want      error
	}{
		{"a tampered body", signed(hookSecret, now, hookBody, "42"), strings.Replace(hookBody, `"available":0`, `"available":9`, 1), 0, client.ErrWebhookSignature},
		{"another secret", signed([]byte("another secret, as long as the first"), now, hookBody, "42"), hookBody, 0, client.ErrWebhookSignature},
		{"a stale timestamp", signed(hookSecret, now.Add(-6*time.Minute), hookBody, "42"), hookBody, 0, client.ErrWebhookStale},
		{"a future timestamp", signed(hookSecret, now.Add(6*time.Minute), hookBody, "42"), hookBody, 0, client.ErrWebhookStale},
		{"past a tolerance of 30s", signed(hookSecret, now.Add(-time.Minute), hookBody, "42"), hookBody, 30 * time.Second, client.ErrWebhookStale},
		{"no headers", http.Header{}, hookBody, 0, client.ErrWebhookHeaders},
		{"a timestamp that is not unix seconds", with(signed(hookSecret, now, hookBody, "42"), "X-Timestamp", now.Format(time.RFC3339)), hookBody, 0, client.ErrWebhookHeaders},
		{"a signature that is not hex", with(signed(hookSecret, now, hookBody, "42"), "X-Signature", "not hex"), hookBody, 0, client.ErrWebhookHeaders},
		{"a short signature", with(signed(hookSecret, now, hookBody, "42"), "X-Signature", "abcd"), hookBody, 0, client.ErrWebhookHeaders},
		{"an X-Event-Id that is not the event's", signed(hookSecret, now, hookBody, "41"), hookBody, 0, client.ErrWebhookBody},
		{"a signed body that is not an event", signed(hookSecret, now, `{"hello":1}`, "0"), `{"hello":1}`, 0, client.ErrWebhookBody},
		{"two events in one body", signed(hookSecret, now, hookBody+hookBody, "42"), hookBody + hookBody, 0, client.ErrWebhookBody},
	} {
		ev, err := client.VerifyWebhook(hookSecret, c.header, []byte(c.body), now, c.tolerance)
		require.ErrorIs(t, err, c.want, c.what)
		require.Equal(t, client.StockEvent{}, ev, c.what)
	}
	for _, h := range []string{"X-Timestamp", "X-Signature", "X-Event-Id"} {
		header := signed(hookSecret, now, hookBody, "42")
		header.Del(h)
		_, err := client.VerifyWebhook(hookSecret, header, []byte(hookBody), now, 0)
		require.ErrorIs(t, err, client.ErrWebhookHeaders, "without %s", h)
	}
}

func with(h http.Header, key, value string) http.Header {
	h.Set(key, value)
	return h
}

// A receiver behind net/http: it reads the body whole (bounded), verifies
// it, and answers 2xx once the event is kept (once per id: deliveries are
// at least once), 401 for a delivery it cannot trust.
func ExampleVerifyWebhook() {
	secret := hookSecret // the subscription's secret, as given to PUT /v1/webhooks/{id}
	seen := map[int64]bool{}
	receiver := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
		if err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		ev, err := client.VerifyWebhook(secret, r.Header, body, time.Now(), 0)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if !seen[ev.Id] { // a duplicate delivery changes nothing
			seen[ev.Id] = true
			fmt.Printf("%s of %s (campaign %s), seq %d\n", ev.Type, ev.Sku, *ev.CampaignId, ev.Seq)
		}
		w.WriteHeader(http.StatusNoContent)
	})

	for _, body := range []string{hookBody, hookBody, strings.Replace(hookBody, "DEMO-PHONE", "DEMO-TSHIRT", 1)} {
		req := httptest.NewRequest("POST", "/hooks/inventory", strings.NewReader(body))
		req.Header = signed(hookSecret, time.Now(), hookBody, "42") // the third: signed for another body
		rec := httptest.NewRecorder()
		receiver.ServeHTTP(rec, req)
		fmt.Println(rec.Code)
	}
	// Output:
	// campaign.sold_out of DEMO-PHONE (campaign spring), seq 3
	// 204
	// 204
	// 401
}
