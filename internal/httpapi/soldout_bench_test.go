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

// BenchmarkSeckillSoldOut is the handler's own cost of a sold-out answer
// (no network, no load generator): the path make bench's sold-out phase
// measures end to end.
func BenchmarkSeckillSoldOut(b *testing.B) {
	a, err := app.New(context.Background(), app.Config{
		HTTPAddr: "127.0.0.1:0", OrderTTL: 15 * time.Minute, ShutdownTimeout: 5 * time.Second, SeckillRate: 1e9,
		ClientTokens: []string{"c1-5b0e1c9f7a2d4e6b8c3f1a0d9e7b5c2a"},
	}, slog.New(slog.DiscardHandler))
	require.NoError(b, err)
	require.NoError(b, a.Start(context.Background()))
	b.Cleanup(func() { _ = a.Shutdown(context.Background()) })
	ctx := context.Background()
	_, err = a.Catalog.Put(ctx, "GONE", 0, 0)
	require.NoError(b, err)
	h := a.Handler()
	buyer := buyerToken(b, a, "bench") // as make bench's clients send it
	buy := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/seckill/GONE/buy", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+a.Cfg.ClientTokens[0])
		req.Header.Set("X-Buyer-Token", buyer)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for i := 0; !strings.Contains(buy().Body.String(), "sold out"); i++ {
		require.Less(b, i, 100, "the sold-out flag is set")
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if rec := buy(); rec.Code != http.StatusConflict {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	})
}

// BenchmarkCampaignNotStarted is the handler's own cost of a buy before a
// campaign's opening (409 sale_not_started with Retry-After): the path
// make bench's openings measure before starts_at, to be at least as cheap
// as BenchmarkSeckillSoldOut's (the buyer token and the Idempotency-Key
// are still checked).
func BenchmarkCampaignNotStarted(b *testing.B) {
	a, err := app.New(context.Background(), app.Config{
		HTTPAddr: "127.0.0.1:0", OrderTTL: 15 * time.Minute, ShutdownTimeout: 5 * time.Second, SeckillRate: 1e9,
		ClientTokens: []string{"c1-5b0e1c9f7a2d4e6b8c3f1a0d9e7b5c2a"},
	}, slog.New(slog.DiscardHandler))
	require.NoError(b, err)
	require.NoError(b, a.Start(context.Background()))
	b.Cleanup(func() { _ = a.Shutdown(context.Background()) })
	ctx := context.Background()
	_, err = a.Catalog.Put(ctx, "SOON", 10, 0)
	require.NoError(b, err)
	starts := time.Now().Add(time.Hour)
	_, err = a.Campaigns.Put(ctx, "soon", campaign.Spec{SKU: "SOON", Allotment: 10, StartsAt: starts, EndsAt: starts.Add(time.Hour)}, nil)
	require.NoError(b, err)
	h := a.Handler()
	buyer := buyerToken(b, a, "bench")
	buy := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/campaigns/soon/buy", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+a.Cfg.ClientTokens[0])
		req.Header.Set("X-Buyer-Token", buyer)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	require.Contains(b, buy().Body.String(), "sale_not_started")
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if rec := buy(); rec.Code != http.StatusConflict {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	})
}
