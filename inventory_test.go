package inventory_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
)

func TestValidators(t *testing.T) {
	for _, ok := range []string{"A", "DEMO-TSHIRT", "a.b_c-9", strings.Repeat("x", 64)} {
		require.NoError(t, inventory.ValidateSKU(ok), ok)
	}
	for _, bad := range []string{"", "-A", ".A", "A{b}", "A/B", "A%2D", "A B", "é", strings.Repeat("x", 65)} {
		err := inventory.ValidateSKU(bad)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, bad)
		require.True(t, strings.HasPrefix(err.Error(), "inventory: invalid argument: sku must be 1-64 characters"), err.Error())
	}
	require.NoError(t, inventory.ValidateToken("order:42."+strings.Repeat("t", 119)))
	for _, bad := range []string{"", ":x", "a b", strings.Repeat("t", 129)} {
		require.ErrorIs(t, inventory.ValidateToken(bad), inventory.ErrInvalidArgument, bad)
	}
	require.NoError(t, inventory.ValidateQty(1, 5))
	require.NoError(t, inventory.ValidateQty(5, 5))
	for _, q := range []int64{0, -1, 6} {
		require.EqualError(t, inventory.ValidateQty(q, 5), "inventory: invalid argument: qty must be between 1 and 5, got "+itoa(q))
	}
	long := strings.Repeat("y", 100)
	require.Equal(t, strings.Repeat("y", 80)+"...", inventory.Truncate(long))
}

func itoa(n int64) string {
	return map[int64]string{0: "0", -1: "-1", 6: "6"}[n]
}

// An unknown SKU is not-found to the HTTP layer and unknown to the Redis
// adapter's init: one error, both sentinels.
func TestUnknownSKUIsBothSentinels(t *testing.T) {
	var err error = inventory.UnknownSKU("X")
	require.ErrorIs(t, err, inventory.ErrNotFound)
	require.ErrorIs(t, err, inventory.ErrUnknownSKU)
	require.NotErrorIs(t, err, inventory.ErrConflict)
	require.EqualError(t, err, "unknown sku: X")
	wrapped := errors.Join(errors.New("reading"), err)
	require.ErrorIs(t, wrapped, inventory.ErrNotFound)
}
