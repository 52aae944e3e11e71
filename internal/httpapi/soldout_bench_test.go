package httpapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/app"
	"github.com/acme/inventory/internal/campaign"
)

// benchApp is an embedded service for the handler benchmarks, and buy
// sends one buy to path as make bench's clients send it (the client
// credential and a buyer token).
func benchApp(b *testing.B) (*app.App, func(path string) *httptest.ResponseRecorder) {
	a, err := app.New(context.Background(), app.Config{
		HTTPAddr: "127.0.0.1:0", OrderTTL: 15 * time.Minute, ShutdownTimeout: 5 * time.Second, SeckillRate: 1e9,
		ClientTokens: []string{"c1-5b0e1c9f7a2d4e6b8c3f1a0d9e7b5c2a"},
	}, slog.New(slog.DiscardHandler))
	require.NoError(b, err)
	require.NoError(b, a.Start(context.Background()))
	b.Cleanup(func() { _ = a.Shutdown(context.Background()) })
	h := a.Handler()
	buyer := buyerToken(b, a, "bench")
	return a, func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+a.Cfg.ClientTokens[0])
		req.Header.Set("X-Buyer-Token", buyer)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
}

// refusals runs send in parallel, each answer a 409.
func refusals(b *testing.B, send func() *httptest.ResponseRecorder) {
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if rec := send(); rec.Code != http.StatusConflict {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	})
}

// BenchmarkSeckillSoldOut is the handler's own cost of a sold-out answer
// (no network, no load generator): the path make bench's sold-out phase
// measures end to end.
func BenchmarkSeckillSoldOut(b *testing.B) {
	a, buy := benchApp(b)
	_, err := a.Catalog.Put(context.Background(), "GONE", 0, 0)
	require.NoError(b, err)
	send := func() *httptest.ResponseRecorder { return buy("/v1/seckill/GONE/buy") }
	for i := 0; !strings.Contains(send().Body.String(), "sold out"); i++ {
		require.Less(b, i, 100, "the sold-out flag is set")
	}
	refusals(b, send)
}

// scheduled puts campaign "soon" of SKU SOON, opening in an hour.
func scheduled(b *testing.B, a *app.App) {
	ctx := context.Background()
	_, err := a.Catalog.Put(ctx, "SOON", 10, 0)
	require.NoError(b, err)
	starts := time.Now().Add(time.Hour)
	_, err = a.Campaigns.Put(ctx, "soon", campaign.Spec{SKU: "SOON", Allotment: 10, StartsAt: starts, EndsAt: starts.Add(time.Hour)}, nil)
	require.NoError(b, err)
}

// BenchmarkCampaignNotStarted is the handler's own cost of a buy before a
// campaign's opening (409 sale_not_started with Retry-After): the path
// make bench's openings measure before starts_at, to be at least as cheap
// as BenchmarkSeckillSoldOut's (the buyer token and the Idempotency-Key
// are still checked).
func BenchmarkCampaignNotStarted(b *testing.B) {
	a, buy := benchApp(b)
	scheduled(b, a)
	send := func() *httptest.ResponseRecorder { return buy("/v1/campaigns/soon/buy") }
	require.Contains(b, send().Body.String(), "sale_not_started")
	refusals(b, send)
}

// BenchmarkCampaignPoll is the handler's own cost of a product page's
// countdown poll (GET /v1/campaigns/{id}, no If-None-Match): the other
// request make bench's openings measure before starts_at.
func BenchmarkCampaignPoll(b *testing.B) {
	a, _ := benchApp(b)
	scheduled(b, a)
	h := a.Handler()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodGet, "/v1/campaigns/soon", nil)
			req.Header.Set("Authorization", "Bearer "+a.Cfg.ClientTokens[0])
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	})
}
