package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/testrig"
)

// deadlockVictims collects the statements of db that InnoDB ended as a
// deadlock's victim (1213), GORM's and the group commit's
// (testrig.ObserveStatements): the deadlocks of this rig alone, whatever
// other tests do on the same server meanwhile.
type deadlockVictims struct {
	mu   sync.Mutex
	sqls []string
}

func watchDeadlocks(t *testing.T, db *gorm.DB) *deadlockVictims {
	t.Helper()
	v := &deadlockVictims{}
	seen := func(sql string, err error) {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1213 {
			v.mu.Lock()
			v.sqls = append(v.sqls, strings.Join(strings.Fields(sql), " "))
			v.mu.Unlock()
		}
	}
	testrig.ObserveStatements(t, db, seen)
	return v
}

func (v *deadlockVictims) take() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.sqls
	v.sqls = nil
	return out
}

// A flash sale's hottest moment is its sold-out line: buyers take the
// pool's last units while cancels give units back to it. A sale locks the
// campaign's row (the window its pool UPDATE checks) before the pool's.
// Two deadlocks lived there, both with the campaign's row written after
// the pool's: a give-back that locked the pool's row first and then wrote
// campaign.back_in_stock, against a sale; and the sale that took the last
// unit, upgrading its shared lock to write campaign.sold_out, against
// the other group commit's sale (or a give-back) holding or waiting for
// it. Both sides were run again, so nothing was lost, but the work was
// wasted exactly then, and a crowd of cancels could run out of retries.
// Buyers and their cancels race across the line here, round after round:
// not one statement of this rig may be a deadlock's victim (counted on
// the rig's own connections: other tests share the server), and the pool
// ends where it began.
func TestSalesAndGiveBacksCrossTheSoldOutLineWithoutDeadlocks(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	const allotment = 4
	id, sku := put(t, r, 100, allotment, 0, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	victims := watchDeadlocks(t, r.DB)
	var sold, refused, crossings atomic.Int64
	for round := range 3 {
		testrig.Race(12, func(i int) {
			for k := range 6 {
				o, err := r.Campaigns.Buy(ctx, id, fmt.Sprintf("u%d-%d-%d", round, i, k), "")
				if errors.Is(err, inventory.ErrInsufficientStock) {
					refused.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					t.Errorf("buyer %d: %v", i, err)
					return
				}
				sold.Add(1)
				if _, err := r.Orders.Cancel(ctx, o.ID); err != nil {
					t.Errorf("cancel %s: %v", o.ID, err)
					return
				}
			}
		})
		crossings.Store(r.Raw(`SELECT COUNT(*) FROM stock_events WHERE campaign_id = ? AND type IN (?, ?)`,
			id, arbiter.EventCampaignSoldOut, arbiter.EventCampaignBackInStock))
		if d := victims.take(); len(d) > 0 {
			t.Fatalf("round %d: %d deadlock victims (%d sold, %d refused, %d sold-out/back events so far); the victims' statements:\n%s",
				round, len(d), sold.Load(), refused.Load(), crossings.Load(), strings.Join(d, "\n"))
		}
	}
	t.Logf("%d sold and cancelled, %d refused, %d sold-out/back events", sold.Load(), refused.Load(), crossings.Load())
	require.NotZero(t, crossings.Load(), "the race crossed the sold-out line")
	n, err := arbiter.CountCampaign(r.DB, id)
	require.NoError(t, err)
	require.Equal(t, arbiter.CampaignCounts{Left: allotment}, n)
	r.RequireQty(sku, 100, allotment)
	r.CheckInvariant(sku)
}
