package order_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory/internal/listing"
	"github.com/acme/inventory/internal/rawtx"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

// Every statement the service sends on orders reads it through the index
// that serves it, and reads about the rows its answer needs, never the
// table: on the real MariaDB, with a history of orders in every state
// beside orders made through the service, each statement is captured as
// the service sends it and run again under ANALYZE (MariaDB's EXPLAIN with
// the rows it actually read). A change that drops an index a query needs,
// or that sends a query no index serves, fails here. The table of
// docs/benchmarks.md is this test's log on a larger history
// (INVENTORY_PLANS_HISTORY=200000 INVENTORY_PLANS_EACH=2000, -v). The
// metrics scrape's count of PENDING orders is checked by internal/app's
// TestScrapeReadsLiveRowsOnly.
func TestOrderQueriesReadTheirIndexes(t *testing.T) {
	history, each := envInt(t, "INVENTORY_PLANS_HISTORY", 3000), envInt(t, "INVENTORY_PLANS_EACH", 20)
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	h := writeHistory(t, r, history)
	st := fillEveryState(t, r, each, 10)
	require.NoError(t, r.DB.Exec(`ANALYZE TABLE orders, stock_reservations`).Error)

	pick := func(kind string) string { return st.ids[kind][0] }
	var keyed order.Order
	require.NoError(t, r.DB.Where("idempotency_key IS NOT NULL AND status = ? AND user_id LIKE ?", order.Paid, "st-%").Take(&keyed).Error)
	o, err := r.Orders.Get(ctx, keyed.ID)
	require.NoError(t, err)
	keyedLines := o.Lines()
	oldest := h.created[len(h.created)/10] // a narrow window of creation, in the older history
	window := listing.OrderQuery{CreatedFrom: oldest, CreatedTo: oldest.Add(h.step * 40)}
	page := listing.DefaultPageSize + 1
	cases := []struct {
		name string
		run  func() error
		key  string  // the index every plan row on orders uses ("a|b": one of them)
		rows float64 // at most this many rows read per plan row on orders
	}{
		{"Get (id)", func() error { _, err := r.Orders.Get(ctx, pick("PAID")); return err }, "PRIMARY", 1},
		{"Create: the replay of an Idempotency-Key", func() error {
			_, err := r.Orders.Create(ctx, keyed.UserID, *keyed.IdempotencyKey, keyedLines)
			return err
		}, "PRIMARY", 1}, // found through idempotency_keys, then by its id
		{"Cancel (conditional UPDATE by id, then Get)", func() error { _, err := r.Orders.Cancel(ctx, pick("PENDING")); return err }, "PRIMARY|orders_status_id", 1},
		{"Expire (the same, expires_at <= now)", func() error { _, err := r.Orders.Expire(ctx, pick("PENDING")); return err }, "PRIMARY|orders_status_id", 1},
		{"Pay (SELECT ... FOR UPDATE, UPDATE by id)", func() error { return paid(r, st.ids["PENDING"][1], order.Paid) }, "PRIMARY|orders_status_id", 1},
		{"Pay late (the same, then the reservation again)", func() error { return paid(r, pick("EXPIRED"), order.Paid) }, "PRIMARY|orders_status_id", 1},
		{"Refund", func() error { _, err := r.Orders.Refund(ctx, pick("PAID")); return err }, "PRIMARY|orders_status_id", 1},
		{"Extend (UPDATE and its read in one text)", func() error {
			// to past every live hold's deadline: a range of expires_at
			// would read them all, the order's id reads one row
			_, err := r.Orders.Extend(ctx, st.ids["PENDING"][2], "", "", 90*time.Minute)
			return err
		}, "PRIMARY|orders_status_id", 1},
		{"Deadline (the delay queue's check)", func() error { _, _, err := r.Orders.Deadline(ctx, pick("PENDING")); return err }, "PRIMARY", 1},
		{"ExpiredIDs (the sweep)", func() error { _, err := r.Orders.ExpiredIDs(ctx, 500); return err }, "orders_status_expires", float64(h.overdue + 1)},
		{"List, no filter", func() error { return list(r, listing.OrderQuery{}) }, "PRIMARY", float64(page)},
		{"List, no filter, next page", func() error { return list(r, listing.OrderQuery{After: h.ids[len(h.ids)/2]}) }, "PRIMARY", float64(page)},
		{"List by buyer", func() error { return list(r, listing.OrderQuery{UserID: h.users[0]}) }, "orders_user_id", float64(page)},
		{"List by buyer, next page", func() error { return list(r, listing.OrderQuery{UserID: h.users[0], After: h.ids[len(h.ids)/2]}) }, "orders_user_id", float64(page)},
		{"List by buyer and status", func() error { return list(r, listing.OrderQuery{UserID: h.users[0], Status: order.Paid}) }, "orders_user_id", float64(2 * page)},
		{"List by buyer and a rare status", func() error {
			return list(r, listing.OrderQuery{UserID: h.users[0], Status: order.RefundRequired})
		}, "orders_user_id", float64(h.perUser + 1)},
		{"List by buyer and a window", func() error {
			q := window
			q.UserID = h.users[0]
			// left to the optimizer: it reads the buyer's orders on
			// orders_user_id, the window as a rowid filter on
			// orders_created_id
			return list(r, q)
		}, "orders_user_id|orders_created_id", float64(h.perUser)},
		{"List by a window", func() error { return list(r, window) }, "orders_created_id", 45},
		{"List by a status and a window", func() error {
			q := window
			q.Status = order.Paid
			return list(r, q)
		}, "orders_created_id|orders_status_id", 45},
	}
	// (The listing names orders_status_id and orders_user_id to MariaDB:
	// left to choose, it read the next page of PAID, the status of most
	// orders, by its equality alone from the newest PAID order down, 992
	// rows of this history for 51.)
	for _, s := range order.Statuses {
		cases = append(cases, struct {
			name string
			run  func() error
			key  string
			rows float64
		}{"List by status " + string(s), func() error { return list(r, listing.OrderQuery{Status: s}) }, "orders_status_id", float64(page)},
			struct {
				name string
				run  func() error
				key  string
				rows float64
			}{"List by status " + string(s) + ", next page", func() error {
				return list(r, listing.OrderQuery{Status: s, After: h.ids[len(h.ids)/2]})
			}, "orders_status_id", float64(page)})
	}

	raw, err := r.DB.DB()
	require.NoError(t, err)
	for _, c := range cases {
		stmts := capture(t, r.DB, func() { require.NoError(t, c.run(), c.name) })
		require.NotEmpty(t, stmts, "%s sent no statement on orders", c.name)
		for _, s := range stmts {
			for _, p := range analyze(t, raw, s) {
				if p["table"] != "orders" && p["table"] != "o" {
					continue
				}
				// r_rows is NULL for a const read (done while planning) and
				// carries the filter's share after it with a rowid filter
				// ("2.00 (2%)"): the rows read are its leading number.
				rows := 0.0
				if f := strings.Fields(p["r_rows"]); len(f) > 0 {
					rows, err = strconv.ParseFloat(f[0], 64)
					require.NoError(t, err, "%s: r_rows %q", c.name, p["r_rows"])
				}
				t.Logf("| %s | `%s` | %s | %s | %s | %.0f |", c.name, shorten(s), p["type"], p["key"], p["Extra"], rows)
				require.NotEqual(t, "ALL", p["type"], "%s: a full scan of orders: %s\n%v", c.name, s, p)
				// a plan row with a rowid filter names two indexes ("a|b"):
				// each must be one that serves the statement
				for _, k := range strings.Split(p["key"], "|") {
					require.Contains(t, strings.Split(c.key, "|"), k, "%s: %s\n%v", c.name, s, p)
				}
				require.LessOrEqual(t, rows, c.rows, "%s reads %v rows of %d: %s\n%v", c.name, rows, history, s, p)
			}
		}
	}
}

func list(r *testrig.Rig, q listing.OrderQuery) error {
	_, err := r.Listing.Orders(context.Background(), q)
	return err
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, name)
	return n
}

func shorten(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return strings.ReplaceAll(s, "|", `\|`)
}

// capture runs fn and returns every statement sent on db meanwhile that
// names orders, as sent (its arguments in the text).
func capture(t *testing.T, db *gorm.DB, fn func()) []string {
	t.Helper()
	var mu sync.Mutex
	var out []string
	name := "plans:" + t.Name()
	keep := func(s string) {
		if strings.Contains(s, "orders") {
			mu.Lock()
			out = append(out, s)
			mu.Unlock()
		}
	}
	record := func(tx *gorm.DB) { keep(tx.Dialector.Explain(tx.Statement.SQL.String(), tx.Statement.Vars...)) }
	// and the group commit's, sent past GORM
	defer rawtx.Observe(db, func(s rawtx.Statement) { keep(db.Dialector.Explain(s.SQL, s.Args...)) })()
	cb := db.Callback()
	require.NoError(t, cb.Query().After("gorm:query").Register(name, record))
	require.NoError(t, cb.Update().After("gorm:update").Register(name, record))
	require.NoError(t, cb.Raw().After("gorm:raw").Register(name, record))
	require.NoError(t, cb.Row().After("gorm:row").Register(name, record))
	defer func() {
		_ = cb.Query().Remove(name)
		_ = cb.Update().Remove(name)
		_ = cb.Raw().Remove(name)
		_ = cb.Row().Remove(name)
	}()
	fn()
	return out
}

// analyze runs each statement of s under ANALYZE in a transaction it rolls
// back (ANALYZE executes the statement) and returns the plan rows.
func analyze(t *testing.T, db *sql.DB, s string) []map[string]string {
	t.Helper()
	tx, err := db.Begin()
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	var plan []map[string]string
	for _, one := range strings.Split(s, ";\n") {
		rows, err := tx.Query("ANALYZE " + one)
		require.NoError(t, err, one)
		plan = append(plan, testenv.Rows(t, rows)...)
	}
	return plan
}

// orderHistory is what writeHistory wrote.
type orderHistory struct {
	ids, users []string
	created    []time.Time // in id order
	step       time.Duration
	perUser    int
	overdue    int // PENDING past their deadline: what the sweep finds
}

// writeHistory writes n orders of the past month straight into orders,
// in creation order, as a service that ran for a while leaves them:
// mostly PAID, some of every other state, a tenth PENDING (holding for
// another hour, but one in ten of them overdue: what the sweep is for), a
// third placed with a key, spread over 30 buyers.
func writeHistory(t *testing.T, r *testrig.Rig, n int) orderHistory {
	t.Helper()
	h := orderHistory{perUser: n / 30, step: 30 * 24 * time.Hour / time.Duration(max(n, 1))}
	for u := range 30 {
		h.users = append(h.users, fmt.Sprintf("h-u%02d", u))
	}
	start := time.Now().UTC().Add(-31 * 24 * time.Hour).Truncate(time.Microsecond)
	statuses := []order.Status{order.Paid, order.Paid, order.Paid, order.Paid, order.Paid, order.Paid,
		order.Cancelled, order.Expired, order.Refunded, order.Pending}
	const batch = 500
	for i := 0; i < n; i += batch {
		var args []any
		var values []string
		for j := i; j < min(i+batch, n); j++ {
			id := uuid.Must(uuid.NewV7()).String()
			created := start.Add(time.Duration(j) * h.step)
			s := statuses[j%len(statuses)]
			if j%50 == 49 {
				s = order.RefundRequired
			}
			expires := created.Add(15 * time.Minute)
			if s == order.Pending && j%100 != 9 { // a live hold (no query here reads its created_at)
				expires = time.Now().UTC().Add(time.Hour)
			} else if s == order.Pending {
				h.overdue++
			}
			var key, payment, paidAt any
			if j%3 == 0 {
				key = fmt.Sprintf("hk-%d", j)
			}
			if s == order.Paid || s == order.Refunded || s == order.RefundRequired {
				payment, paidAt = "hpay-"+id, created.Add(time.Minute)
			}
			values = append(values, "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
			args = append(args, id, h.users[j%30], key, s, id, payment, expires, paidAt, created, created)
			h.ids = append(h.ids, id)
			h.created = append(h.created, created)
		}
		require.NoError(t, r.DB.Exec(`INSERT INTO orders (id, user_id, idempotency_key, status, reservation_token, payment_id,
			expires_at, paid_at, created_at, updated_at) VALUES `+strings.Join(values, ", "), args...).Error)
	}
	return h
}
