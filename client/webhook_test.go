package client_test

import (
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/client"
)

// A delivery signed with the secret verifies; one with another secret, a
// changed body, an old timestamp or no event id does not.
func TestVerifyDelivery(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef"
	now := time.Unix(1_800_000_000, 0)
	body := `{"id":7,"type":"sku.sold_out","sku":"A","seq":1}`
	req := func(body, signWith string, at time.Time, id string) *http.Request {
		ts := strconv.FormatInt(at.Unix(), 10)
		r := httptest.NewRequest("POST", "/hook", strings.NewReader(body))
		r.Header.Set("X-Timestamp", ts)
		r.Header.Set("X-Signature", hex.EncodeToString(inventory.Sign(signWith, ts, []byte(body))))
		r.Header.Set("X-Event-Id", id)
		return r
	}
	got, id, err := client.VerifyDelivery(req(body, secret, now, "7"), secret, now.Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, body, string(got))
	require.EqualValues(t, 7, id)
	for name, r := range map[string]*http.Request{
		"another secret": req(body, secret+"x", now, "7"),
		"too old":        req(body, secret, now.Add(-6*time.Minute), "7"),
		"no event id":    req(body, secret, now, ""),
	} {
		_, _, err := client.VerifyDelivery(r, secret, now)
		require.ErrorIs(t, err, client.ErrBadDelivery, name)
	}
	changed := req(body, secret, now, "7")
	changed.Body = httptest.NewRequest("POST", "/", strings.NewReader(strings.Replace(body, "A", "B", 1))).Body
	_, _, err = client.VerifyDelivery(changed, secret, now)
	require.ErrorIs(t, err, client.ErrBadDelivery, "a changed body")
}
