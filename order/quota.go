package order

import (
	"fmt"
)

// The per-user limit is arbitrated like stock: buyer_quotas holds what each
// buyer holds or bought of each limited SKU, and a reservation counts there
// in the transaction that records it, under a conditional increment. Redis
// only pre-filters seckill buyers (the admission script counts them) and may forget; the
// database does not. A release (cancel, timeout) gives the units back.

// errOverLimit: the reservation would take a buyer past the SKU's per-user
// limit. It is a conflict.
type errOverLimit struct {
	sku, user string
	limit     int64
}

func (e errOverLimit) Error() string {
	return fmt.Sprintf("buyer %s reached the per-user limit of %d for %s", e.user, e.limit, e.sku)
}

func (e errOverLimit) Unwrap() error { return ErrConflict }

// buyerUnits is a quantity of sku counted against user's limit.
type buyerUnits struct {
	sku, user string
	qty       int64
}
