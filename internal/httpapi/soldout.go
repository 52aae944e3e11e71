package httpapi

import (
	"sync"
	"time"
)

// SoldOut remembers, per process, which SKUs are sold out, so a burst of
// buyers after the last unit is answered without touching Redis. A flag is
// cleared when stock comes back (Clear, wired to a broadcast every node
// receives) and, as a safety net for a lost broadcast, expires after TTL.
type SoldOut struct {
	ttl   time.Duration
	now   func() time.Time
	flags sync.Map // sku -> time.Time (expiry)
}

func NewSoldOut(ttl time.Duration, now func() time.Time) *SoldOut {
	if now == nil {
		now = time.Now
	}
	return &SoldOut{ttl: ttl, now: now}
}

func (s *SoldOut) Set(sku string) { s.flags.Store(sku, s.now().Add(s.ttl)) }

// SetUntil is Set, the flag expiring at until if that is sooner (a
// campaign's end: after it a buy is answered sale_ended, not sold out).
func (s *SoldOut) SetUntil(sku string, until time.Time) {
	exp := s.now().Add(s.ttl)
	if until.Before(exp) {
		exp = until
	}
	s.flags.Store(sku, exp)
}

func (s *SoldOut) Clear(sku string) { s.flags.Delete(sku) }

func (s *SoldOut) Is(sku string) bool {
	v, ok := s.flags.Load(sku)
	return ok && s.now().Before(v.(time.Time))
}
