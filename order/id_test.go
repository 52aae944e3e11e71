package order_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/acme/inventory/order"
)

// ValidateID accepts exactly what the ids' pattern describes.
func TestValidateIDIsThePattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`)
	ids := []string{"", "a", "Z9", "0", ".a", "_a", "-a", ":a", "a.b_c-d:e", "a{b}", "a b", "é", "a\x00", "a/b",
		strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 65), "0192a4c2-7e6b-7000-8000-000000000001", "u1", "a::"}
	for c := 0; c < 256; c++ {
		ids = append(ids, string(rune(c)), "a"+string([]byte{byte(c)}))
	}
	for _, id := range ids {
		if got, want := order.ValidateID("user_id", id) == nil, pattern.MatchString(id); got != want {
			t.Errorf("ValidateID(%q) accepts: %v, the pattern: %v", id, got, want)
		}
	}
}
