//go:build faultbugs

package httpapi

import (
	"context"
	"sync"
	"time"

	"github.com/acme/inventory/internal/catalog"
	"github.com/acme/inventory/internal/testbugs"
)

// staleViews is testbugs.StaleRead's cache: sku -> staleView.
var staleViews sync.Map

type staleView struct {
	v  *catalog.SKUView
	at time.Time
}

// skuView is sku's levels; with testbugs.StaleRead on, from a cache up to
// 1 s old.
func (s *Server) skuView(ctx context.Context, sku string) (*catalog.SKUView, error) {
	if !testbugs.On(testbugs.StaleRead) {
		return s.catalog.Get(ctx, sku)
	}
	if c, ok := staleViews.Load(sku); ok && time.Since(c.(staleView).at) < time.Second {
		return c.(staleView).v, nil
	}
	v, err := s.catalog.Get(ctx, sku)
	if err == nil {
		staleViews.Store(sku, staleView{v, time.Now()})
	}
	return v, err
}
