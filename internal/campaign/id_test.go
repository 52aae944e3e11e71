package campaign_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/acme/inventory/internal/campaign"
)

// ValidateID accepts exactly what the id's pattern describes.
func TestValidateIDIsThePattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,59}$`)
	ids := []string{"", "a", "Z9", "0", ".a", "_a", "-a", "a.b_c-d", "a:b", "a{b}", "a b", "é", "a\x00", "a/b",
		strings.Repeat("a", 59), strings.Repeat("a", 60), strings.Repeat("a", 61), "OPEN-1", "c1", "a..", "A-"}
	for c := 0; c < 256; c++ {
		ids = append(ids, string(rune(c)), "a"+string([]byte{byte(c)}))
	}
	for _, id := range ids {
		if got, want := campaign.ValidateID(id) == nil, pattern.MatchString(id); got != want {
			t.Errorf("ValidateID(%q) accepts: %v, the pattern: %v", id, got, want)
		}
	}
}
