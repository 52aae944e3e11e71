//go:build !faultbugs

package httpapi

import (
	"context"

	"github.com/acme/inventory/internal/catalog"
)

// skuView is sku's levels.
func (s *Server) skuView(ctx context.Context, sku string) (*catalog.SKUView, error) {
	return s.catalog.Get(ctx, sku)
}
