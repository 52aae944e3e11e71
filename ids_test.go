package inventory_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/acme/inventory"
)

// Each id rule accepts exactly what its pattern describes.
func TestIDRulesAreTheirPatterns(t *testing.T) {
	ids := []string{"", "a", "Z9", "0", ".a", "_a", "-a", ":a", "a.b_c-d:e", "a.b_c-d", "a{b}", "a b", "é", "a\x00", "a/b",
		"0192a4c2-7e6b-7000-8000-000000000001", "u1", "a::", "a:b"}
	for _, n := range []int{39, 40, 41, 59, 60, 61, 63, 64, 65} {
		ids = append(ids, strings.Repeat("a", n))
	}
	for c := 0; c < 256; c++ {
		ids = append(ids, string(rune(c)), "a"+string([]byte{byte(c)}))
	}
	rules := map[string]struct {
		pattern string
		check   func(string) error
	}{
		"user id":     {`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`, inventory.ValidateUserID},
		"order id":    {`^[A-Za-z0-9][A-Za-z0-9._:-]{0,39}$`, func(id string) error { return inventory.ValidateOrderID("order id", id) }},
		"payment id":  {`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`, inventory.ValidatePaymentID},
		"campaign id": {`^[A-Za-z0-9][A-Za-z0-9._-]{0,59}$`, inventory.ValidateCampaignID},
	}
	for name, r := range rules {
		pattern := regexp.MustCompile(r.pattern)
		for _, id := range ids {
			if got, want := r.check(id) == nil, pattern.MatchString(id); got != want {
				t.Errorf("%s rule on %q accepts: %v, the pattern: %v", name, id, got, want)
			}
		}
	}
}
