package order

import (
	"fmt"
	"testing"
	"time"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/testenv"
	"gorm.io/gorm"
)

// What building a group commit's orders INSERT costs the service (15
// orders, the seckill phase's mean batch; no database: GORM's dry run):
// GORM's Create, which reflects every field of every row, against the
// statement orderRecord has arbiter.InsertRows write.
func BenchmarkOrdersInsert(b *testing.B) {
	dry := testenv.MySQL(b).Session(&gorm.Session{DryRun: true})
	now := time.Now().UTC().Truncate(time.Microsecond)
	batch := func() []*Order {
		orders := make([]*Order, 15)
		for i := range orders {
			id := fmt.Sprintf("o%02d", i)
			orders[i] = &Order{ID: id, UserID: "u", Status: Pending, ReservationToken: id, ExpiresAt: now, CreatedAt: now, UpdatedAt: now}
		}
		return orders
	}
	b.Run("gorm-create", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := dry.Omit("Items").Create(batch()).Error; err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("insert-rows", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var values []any
			for _, o := range batch() {
				values = append(values, orderRecord(o).Values...)
			}
			if err := arbiter.InsertRows(dry, "orders", orderColumns, values); err != nil {
				b.Fatal(err)
			}
		}
	})
}
