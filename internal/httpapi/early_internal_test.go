package httpapi

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/campaign"
)

// The answer to a buy before the opening is kept per campaign, yet never
// stale: Retry-After follows the clock second by second, a moved opening
// gets its own message, and each is the error path's answer exactly.
func TestEarlyAnswerFollowsTheClockAndTheOpening(t *testing.T) {
	s := &Server{}
	opens := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	moved := opens.Add(time.Hour)
	for _, c := range []struct {
		startsAt, now time.Time
		retryAfter    string
	}{
		{opens, opens.Add(-3 * time.Second), "3"},
		{opens, opens.Add(-2500 * time.Millisecond), "3"}, // rounded up
		{opens, opens.Add(-2 * time.Second), "2"},
		{opens, opens.Add(-time.Millisecond), "1"},
		{moved, opens, "3600"},
		{opens, opens.Add(-2 * time.Second), "2"}, // moved back
	} {
		e := campaign.NotStarted{StartsAt: c.startsAt, Now: c.now}
		a := s.earlyAnswer("soon", e)
		require.Equal(t, []string{c.retryAfter}, a.retryAfter, "now %s", c.now)
		require.Equal(t, string(s.encodedAnswer(notStarted(e))), string(a.body), "now %s", c.now)
		require.Same(t, a, s.earlyAnswer("soon", e), "the same second's answer is kept")
	}
}
