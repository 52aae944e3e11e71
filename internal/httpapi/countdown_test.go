package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/campaign"
)

// A poll's answer, written from the view's countdown and "now", is byte
// for byte what encoding the view whole writes; a view that changes in
// anything but now gets a new countdown and a new ETag, one that changes
// only in now keeps both.
func TestPollAnswerIsTheViewEncoded(t *testing.T) {
	s := &Server{}
	e := echo.New()
	e.JSONSerializer = jsonSerializer{}
	poll := func(v campaign.View, inm string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/v1/campaigns/"+v.ID, nil)
		if inm != "" {
			req.Header.Set("If-None-Match", inm)
		}
		rec := httptest.NewRecorder()
		require.NoError(t, s.pollAnswer(e.NewContext(req, rec), v))
		return rec
	}
	starts := time.Date(2026, 11, 26, 20, 0, 0, 123456000, time.UTC)
	v := campaign.View{ID: "spring-1", SKU: "SKU.1", State: campaign.Scheduled, Allotment: 100, Remaining: 100,
		StartsAt: starts, EndsAt: starts.Add(time.Hour), PerUserLimit: 2, HoldSeconds: 120, Version: "3"}
	var tags []string
	for i, now := range []time.Time{
		starts.Add(-time.Second), starts.Add(-time.Second + 7*time.Microsecond), starts.Add(-time.Hour), starts.Truncate(time.Second),
	} {
		v.Now = now
		rec := poll(v, "")
		require.Equal(t, 200, rec.Code)
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(v))
		require.Equal(t, want.String(), rec.Body.String(), "poll %d", i)
		require.Equal(t, "max-age=1", rec.Header().Get("Cache-Control"))
		tags = append(tags, rec.Header().Get("ETag"))
		require.Equal(t, 304, poll(v, rec.Header().Get("ETag")).Code)
	}
	require.NotEmpty(t, tags[0])
	require.Equal(t, []string{tags[0], tags[0], tags[0], tags[0]}, tags, "now is not in the ETag")
	for _, change := range []func(*campaign.View){
		func(v *campaign.View) { v.State = campaign.Live },
		func(v *campaign.View) { v.Sold, v.Remaining = 1, 99 },
		func(v *campaign.View) { v.Held = 3 },
		func(v *campaign.View) { v.EndsAt = v.EndsAt.Add(time.Minute) },
		func(v *campaign.View) { v.Version = "4" },
	} {
		before := poll(v, "").Header().Get("ETag")
		change(&v)
		rec := poll(v, before)
		require.Equal(t, 200, rec.Code, "a changed view is not 304 to the old ETag")
		var got campaign.View
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
		got.Version = v.Version
		require.Equal(t, v, got)
		require.NotEqual(t, before, rec.Header().Get("ETag"))
	}
}
