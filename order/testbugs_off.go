//go:build !faultbugs

package order

// afterClose is a hook for a deliberate bug of a faultbugs build
// (internal/testbugs); here it does nothing.
func (s *Service) afterClose(*Order, Status) {}
