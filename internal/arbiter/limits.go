package arbiter

import (
	"errors"
	"fmt"

	lru "github.com/hashicorp/golang-lru/v2"
)

// LimitCache holds the per-user limits of SKUs as a writer last read them,
// so a sale need not read them again: the sale's conditional UPDATE of the
// SKU's row checks the limit it counted the buyers' quotas under
// (per_user_limit = that limit), under the row's lock, and a buyer refused
// under a known limit is refused only once the limit is read again and
// found the same; so a limit changed since it was read is never applied
// stale (the transaction runs again, a retryable error, the cache
// corrected). Bounded (the SKUs bought most recently); safe for
// concurrent use. A nil cache holds nothing.
type LimitCache struct{ c *lru.Cache[string, int64] } // 0: no limit

// NewLimitCache is a cache of up to size SKUs' limits.
func NewLimitCache(size int) *LimitCache {
	c, err := lru.New[string, int64](size)
	if err != nil {
		panic(err) // only for a size below 1
	}
	return &LimitCache{c}
}

// Get is the limit held for sku, if any.
func (c *LimitCache) Get(sku string) (int64, bool) {
	if c == nil {
		return 0, false
	}
	return c.c.Get(sku)
}

func (c *LimitCache) set(sku string, limit int64) {
	if c != nil {
		c.c.Add(sku, limit)
	}
}

// errLimitChanged is a sale whose SKU's per-user limit is not the one its
// quotas were counted under: the transaction is to run again (Retryable)
// with the limit the cache now holds.
var errLimitChanged = errors.New("arbiter: the per-user limit changed since it was read")

func limitChanged(sku string, was, is int64) error {
	return fmt.Errorf("%w: %s from %d to %d", errLimitChanged, sku, was, is)
}
