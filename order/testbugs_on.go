//go:build faultbugs

package order

import (
	"time"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/testbugs"
	"gorm.io/gorm"
)

// afterClose, with testbugs.GiveBackTwice on, gives a cancelled order's
// units back a second time in the database and puts reserved right half a
// second later, as reconcile's repair does: the final state is clean, the
// levels read in between are not.
func (s *Service) afterClose(o *Order, to Status) {
	if !testbugs.On(testbugs.GiveBackTwice) || to != Cancelled {
		return
	}
	for _, it := range o.Items {
		s.db.Exec(`UPDATE skus SET reserved = reserved - ? WHERE sku = ? AND reserved >= ?`, it.Qty, it.SKU, it.Qty)
	}
	go func() {
		time.Sleep(500 * time.Millisecond)
		for _, it := range o.Items {
			_ = s.db.Transaction(func(tx *gorm.DB) error { return arbiter.In(tx).FixReserved(it.SKU) })
		}
	}()
}
