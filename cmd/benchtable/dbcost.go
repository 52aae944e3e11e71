package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"github.com/acme/inventory/internal/arbiter"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/acme/inventory/internal/prepconn"
)

// The database's cost of a durable sale, statement by statement (-only
// dbcost): the rows a seckill sale's group commit writes (order/batch.go's
// writeTx and the arbiter's Reserve, with their columns), each alone and
// together, beside the floor (one row, its primary key only), and the
// levers weighed against them. Each variant group-commits batches of
// -dbcost-batch sales from floorWriters writers, with no HTTP and no Go
// service around it, so MariaDB's CPU per sale is the database's alone.
// The variants run in rounds, one after another in each round, so a
// stretch of a noisy machine lands on all of them; the table shows each
// one's median over the rounds and its spread.

var (
	costBatch  = flag.Int("dbcost-batch", 15, "with -only dbcost: sales per group commit (the seckill phase's mean batch)")
	costRounds = flag.Int("dbcost-rounds", 3, "with -only dbcost: rounds of every variant")
)

// costTx is a variant's transaction: database/sql's (statements as text,
// the parameters interpolated by the client, as the service's pool sends
// them) or a writer's own connection's (internal/prepconn, as the group
// commit sends them now).
type costTx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// costStep writes one statement's rows for a batch of sales in tx.
type costStep func(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error

// How a variant's transactions are sent.
const (
	plainTx   = iota // database/sql's Tx on the pool: BEGIN, text, COMMIT
	twoStepTx        // the same, committed as the breaker's pool did on main: COMMIT, then database/sql's empty COMMIT
	ownConn          // each writer's own prepconn.Conn: statements prepared once, one COMMIT under the context
)

type costVariant struct {
	name          string
	rows, entries int // rows and index entries per sale
	trips         int // round trips per group commit, BEGIN and COMMIT included
	steps         []costStep
	mode          int  // plainTx, twoStepTx or ownConn
	varied        bool // batches of 1 to 2×-dbcost-batch−1 sales in turn (the same mean), as the service's vary, not all of -dbcost-batch
}

// costRig is the database the variants write, and what the ownConn
// variants' connections prepared and executed.
type costRig struct {
	db       *sql.DB
	mu       sync.Mutex
	prepared prepconn.Stats // summed over the ownConn variants' connections
}

func (c *costRig) exec(ctx context.Context, tx costTx, q string, args ...any) error {
	_, err := tx.ExecContext(ctx, q, args...)
	return err
}

// valuesOf is "(?, ?), (?, ?)" for n rows of k columns.
func valuesOf(n, k int) string {
	one := "(" + strings.TrimSuffix(strings.Repeat("?, ", k), ", ") + ")"
	return strings.TrimSuffix(strings.Repeat(one+", ", n), ", ")
}

func insertFloor(ctx context.Context, c *costRig, tx costTx, ids []string, _ time.Time) error {
	args := make([]any, 0, 2*len(ids))
	for _, id := range ids {
		args = append(args, id, 1)
	}
	return c.exec(ctx, tx, "INSERT INTO floor_sales (id, qty) VALUES "+valuesOf(len(ids), 2), args...)
}

func insertOrders(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
	return insertOrdersOf(ctx, c, tx, ids, now, func(i int) string { return fmt.Sprintf("buyer%d", i) })
}

// insertOrdersNewBuyers is insertOrders with a buyer never seen before for
// every sale, as a flash crowd's: the entries of the indexes that lead with
// user_id land at random places in them instead of on the same 15 pages.
func insertOrdersNewBuyers(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
	return insertOrdersOf(ctx, c, tx, ids, now, func(int) string { return "b" + strings.ReplaceAll(uuid.NewString(), "-", "")[:15] })
}

func insertOrdersOf(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time, buyer func(i int) string) error {
	args := make([]any, 0, 10*len(ids))
	for i, id := range ids {
		args = append(args, id, buyer(i), nil, "PENDING", id, nil, now.Add(15*time.Minute), nil, now, now)
	}
	return c.exec(ctx, tx, `INSERT INTO orders (id, user_id, idempotency_key, status, reservation_token, payment_id,
		expires_at, paid_at, created_at, updated_at) VALUES `+valuesOf(len(ids), 10), args...)
}

func insertItems(ctx context.Context, c *costRig, tx costTx, ids []string, _ time.Time) error {
	args := make([]any, 0, 3*len(ids))
	for _, id := range ids {
		args = append(args, id, "FLASH", 1)
	}
	return c.exec(ctx, tx, "INSERT INTO order_items (order_id, sku, qty) VALUES "+valuesOf(len(ids), 3), args...)
}

func insertReservations(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
	args := make([]any, 0, 10*len(ids))
	for _, id := range ids {
		args = append(args, id, "FLASH", id, nil, 1, "HELD", 1000, now.Add(15*time.Minute), now, now)
	}
	return c.exec(ctx, tx, `INSERT INTO stock_reservations (token, sku, order_id, buyer, qty, state, result,
		expires_at, created_at, updated_at) VALUES `+valuesOf(len(ids), 10), args...)
}

func insertMovements(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
	return designMovements("stock_movements")(ctx, c, tx, ids, now)
}

// movementPositions numbers the variants' movements of FLASH, unique in
// the process as the unique key (sku, position) wants them. The arbiter
// takes them from the SKU's row its UPDATE bumps (arbitrate sends that
// term and reads the column); here a counter stands in, so a variant's
// steps keep their order and the rows stay what the sale writes.
var movementPositions atomic.Int64

// The storage designs weighed against issue 33's target (MariaDB CPU per
// durable sale ≤ 50 µs and ≤ 2.5× the floor): each writes what a one-line
// seckill sale would write under it, into tables of its own made from the
// service's own (CREATE TABLE ... LIKE, so the charset, collation and
// CHECKs are the real ones, then the design's changes), and runs the hot
// row's statements as the sale does. None of these tables is the
// service's: the service's tables stay as migrated.
//
//   - d1: Idempotency-Keys in a table of their own, written only when a
//     key is given: orders without orders_idempotency and its column (the
//     sales here carry no key, so no keys row).
//   - d2: 16-byte ids: orders.id, the reservation's token and order_id
//     BINARY(16) (the order's reservation_token VARBINARY: the id's 16
//     bytes, or them and ".late"); every secondary entry then carries 16
//     bytes of primary key instead of 36-40 characters.
//   - d3: d1 and d2, and no RESERVE movement: the reservation row is the
//     RESERVE record.
//   - d4: one row per one-line sale: the order row carries the
//     reservation's columns (sku, qty, its state, result, buyer,
//     campaign), with no reservation and no movement row. d4_sales keeps
//     every index a query or a uniqueness of today's orders and
//     reservations still needs: all seven of orders (PRIMARY: every read
//     and transition; orders_idempotency: a key's replay and uniqueness;
//     orders_payment: a payment id's uniqueness; orders_status_expires:
//     the sweep and the pending gauge; orders_user_id, orders_status_id,
//     orders_created_id: the listing by buyer, status, window), and of the
//     reservation's (sku, res_state) for reconcile's and realign's sum of
//     a SKU's live units and (campaign_id, res_state, qty) for a
//     campaign's counts. The reservation's (state, expires_at) goes: the
//     order's (status, expires_at) finds its expired holds; only raw
//     token-API holds use it, and they stay in stock_reservations. A
//     reservation's primary key (token, sku) goes too: a one-line order's
//     token is its id (or id + ".late", a column of the row). d4_lean keeps
//     only PRIMARY, (user_id, id), (status, expires_at), (created_at, id)
//     and (sku, res_state): keys in their own table (d1), the payment id's
//     uniqueness in a table written at payment, no listing by status
//     alone, campaign counts kept elsewhere (the pool row's counters).
//   - d5: d4 with 16-byte ids and without orders_idempotency (keys in
//     their own table).
//   - d6_probe, not a design the product could run: d5_lean with only
//     PRIMARY and (sku, res_state), the arbiter's own (no buyer's listing,
//     no sweep, no window listing). It tells how close to the bound a
//     one-row sale can come at all, so the designs' distance to 2.5× the
//     floor can be read as "the row's indexes" or "the rest".
var designTables = []string{
	`CREATE TABLE d1_orders LIKE orders`,
	`ALTER TABLE d1_orders DROP KEY IF EXISTS orders_idempotency, DROP COLUMN idempotency_key`,
	`CREATE TABLE d1_reservations LIKE stock_reservations`,
	`CREATE TABLE d1_movements LIKE stock_movements`,

	`CREATE TABLE d2_orders LIKE orders`,
	`ALTER TABLE d2_orders MODIFY id BINARY(16) NOT NULL, MODIFY reservation_token VARBINARY(128) NOT NULL,
		ADD UNIQUE KEY IF NOT EXISTS orders_idempotency (user_id, idempotency_key)`,
	`CREATE TABLE d2_reservations LIKE stock_reservations`,
	`ALTER TABLE d2_reservations MODIFY token BINARY(16) NOT NULL, MODIFY order_id BINARY(16) NULL`,
	`CREATE TABLE d2_movements LIKE stock_movements`,

	`CREATE TABLE d3_orders LIKE d2_orders`,
	`ALTER TABLE d3_orders DROP KEY IF EXISTS orders_idempotency, DROP COLUMN idempotency_key`,
	`CREATE TABLE d3_reservations LIKE d2_reservations`,

	`CREATE TABLE d4_sales LIKE orders`,
	`ALTER TABLE d4_sales` + saleColumns + `,
		ADD UNIQUE KEY IF NOT EXISTS orders_idempotency (user_id, idempotency_key),
		ADD KEY sales_sku_state (sku, res_state),
		ADD KEY sales_campaign (campaign_id, res_state, qty)`,
	`CREATE TABLE d4_lean LIKE orders`,
	`ALTER TABLE d4_lean DROP KEY IF EXISTS orders_idempotency, DROP COLUMN idempotency_key,
		DROP KEY orders_payment, DROP KEY orders_status_id,` + saleColumns + `,
		ADD KEY sales_sku_state (sku, res_state)`,

	`CREATE TABLE d5_sales LIKE d4_sales`,
	`ALTER TABLE d5_sales DROP KEY IF EXISTS orders_idempotency, DROP COLUMN idempotency_key,
		MODIFY id BINARY(16) NOT NULL, MODIFY reservation_token VARBINARY(128) NOT NULL`,
	`CREATE TABLE d5_lean LIKE d4_lean`,
	`ALTER TABLE d5_lean MODIFY id BINARY(16) NOT NULL, MODIFY reservation_token VARBINARY(128) NOT NULL`,

	`CREATE TABLE d6_probe LIKE d5_lean`,
	`ALTER TABLE d6_probe DROP KEY orders_status_expires, DROP KEY orders_user_id, DROP KEY orders_created_id`,
}

// saleColumns are the reservation's columns on a one-row sale (d4, d5):
// its token is the order's reservation_token, its expiry the order's.
const saleColumns = `
	ADD COLUMN sku VARCHAR(64) NOT NULL, ADD COLUMN qty INT NOT NULL,
	ADD COLUMN res_state VARCHAR(12) NOT NULL, ADD COLUMN result BIGINT NOT NULL DEFAULT 0,
	ADD COLUMN buyer VARCHAR(64) NULL, ADD COLUMN campaign_id VARCHAR(64) NULL,
	ADD CONSTRAINT sales_qty_valid CHECK (qty >= 0),
	ADD CONSTRAINT sales_res_state_valid CHECK (res_state IN ('HELD', 'COMMITTED', 'SOLD', 'RESTORED', 'RELEASED'))`

// binaryID is a sale's id as its 16 bytes (the designs with BINARY(16) ids).
func binaryID(id string) []byte {
	u := uuid.MustParse(id)
	return u[:]
}

// idOf is id as a design stores it: its text, or its 16 bytes.
func idOf(id string, binary bool) any {
	if binary {
		return binaryID(id)
	}
	return id
}

// designOrders inserts the sales' orders rows into table, as insertOrders
// does; keyed: the table has the idempotency_key column.
func designOrders(table string, binary, keyed bool) costStep {
	return designRows(table, binary, keyed, "")
}

// designRows inserts the sales' orders rows into table with more columns
// (", a, b") and their values, the same for every sale.
func designRows(table string, binary, keyed bool, more string, values ...any) costStep {
	cols := "id, user_id, idempotency_key, status, reservation_token, payment_id, expires_at, paid_at, created_at, updated_at" + more
	k := 10 + len(values)
	if !keyed {
		cols, k = strings.Replace(cols, " idempotency_key,", "", 1), k-1
	}
	return func(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
		args := make([]any, 0, k*len(ids))
		for i, id := range ids {
			args = append(args, idOf(id, binary), fmt.Sprintf("buyer%d", i))
			if keyed {
				args = append(args, nil)
			}
			args = append(args, "PENDING", idOf(id, binary), nil, now.Add(15*time.Minute), nil, now, now)
			args = append(args, values...)
		}
		return c.exec(ctx, tx, "INSERT INTO "+table+" ("+cols+") VALUES "+valuesOf(len(ids), k), args...)
	}
}

// designReservations inserts the sales' reservation rows into table, as
// insertReservations does.
func designReservations(table string, binary bool) costStep {
	return func(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
		args := make([]any, 0, 10*len(ids))
		for _, id := range ids {
			args = append(args, idOf(id, binary), "FLASH", idOf(id, binary), nil, 1, "HELD", 1000, now.Add(15*time.Minute), now, now)
		}
		return c.exec(ctx, tx, "INSERT INTO "+table+` (token, sku, order_id, buyer, qty, state, result,
		expires_at, created_at, updated_at) VALUES `+valuesOf(len(ids), 10), args...)
	}
}

// designMovements inserts the sales' RESERVE movements into table, as
// insertMovements does (the reference is the order id's text).
func designMovements(table string) costStep {
	return func(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
		args := make([]any, 0, 8*len(ids))
		for _, id := range ids {
			args = append(args, "FLASH", movementPositions.Add(1), "RESERVE", 0, 1, "", id, now)
		}
		return c.exec(ctx, tx, "INSERT INTO "+table+` (sku, position, kind, on_hand_delta, reserved_delta, reason,
		reference, created_at) VALUES `+valuesOf(len(ids), 8), args...)
	}
}

// insertLeanHolds inserts the sales' rows of holds, as the lean sale's
// commit does after its UPDATE (arbiter's insertHolds): an order's 16
// bytes, line 0, the SKU's integer and a seq from the positions, its
// name, the buyer, the deadline.
func insertLeanHolds(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
	args := make([]any, 0, 13*len(ids))
	for i, id := range ids {
		args = append(args, binaryID(id), 0, arbiter.SKUID("FLASH"), movementPositions.Add(1), "FLASH", 1, 1000, nil,
			fmt.Sprintf("buyer%d", i), false, nil, now.Add(15*time.Minute), now)
	}
	return c.exec(ctx, tx, `INSERT INTO holds (id, line, sku_id, seq, sku, qty, result, name, buyer, quota, campaign_id,
		deadline, created_at) VALUES `+valuesOf(len(ids), 13), args...)
}

// projectLean is the projector's round over the batch's holds, sent in
// the sale's own transaction so that its cost lands beside the commit's
// (internal/arbiter's ProjectBacklog and project): the SKUs left to
// project, the SKU's holds past its cursor, the whole orders' lines, the
// orders projected already, the order, reservation and RESERVE movement
// rows each written if absent, and the cursor moved (the projector moves
// it in a statement of its own after the round's commit; the cost is
// the same). The projector's real rounds carry up to 1,000
// holds a SKU, not a batch's 15: this is the dearer end.
func projectLean(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
	var projected int64
	if err := queryAll(ctx, tx, func(rows *sql.Rows) error {
		var sku string
		var holdSeq int64
		return rows.Scan(&sku, &projected, &holdSeq)
	}, `SELECT sku, projected_seq, hold_seq FROM skus WHERE holds_dirty = 1 LIMIT 100`); err != nil {
		return err
	}
	var last int64
	if err := queryAll(ctx, tx, func(rows *sql.Rows) error {
		var id []byte
		var line, qty, result, seq int64
		var sku string
		var name, buyer, campaign sql.NullString
		var quota bool
		var deadline, created time.Time
		err := rows.Scan(&id, &line, &seq, &sku, &qty, &result, &name, &buyer, &quota, &campaign, &deadline, &created)
		last = max(last, seq)
		return err
	}, `SELECT id, line, seq, sku, qty, result, name, buyer, quota, campaign_id, deadline, created_at FROM holds
		WHERE sku_id = ? AND seq > ? AND sku = ? ORDER BY seq LIMIT 1000`, arbiter.SKUID("FLASH"), projected, "FLASH"); err != nil {
		return err
	}
	keys := make([]any, len(ids))
	for i, id := range ids {
		keys[i] = binaryID(id)
	}
	if err := queryAll(ctx, tx, func(rows *sql.Rows) error { return nil },
		`SELECT id, line FROM holds WHERE id IN (`+strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")+`)`, keys...); err != nil {
		return err
	}
	strIDs := make([]any, len(ids))
	for i, id := range ids {
		strIDs[i] = id
	}
	if err := queryAll(ctx, tx, func(rows *sql.Rows) error { return nil }, // the orders projected already (none here)
		`SELECT id FROM orders WHERE id IN (`+strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")+`)`, strIDs...); err != nil {
		return err
	}
	orders := make([]any, 0, 7*len(ids))
	reservations := make([]any, 0, 11*len(ids))
	movements := make([]any, 0, 8*len(ids))
	for i, id := range ids {
		deadline := now.Add(15 * time.Minute)
		orders = append(orders, id, fmt.Sprintf("buyer%d", i), "PENDING", id, deadline, now, now)
		reservations = append(reservations, id, "FLASH", id, nil, 1, "HELD", 1000, deadline, now, now, nil)
		movements = append(movements, "FLASH", movementPositions.Add(1), "RESERVE", 0, 1, "", id, now)
	}
	for _, ins := range []struct {
		q    string
		k    int
		args []any
	}{
		{`INSERT INTO orders (id, user_id, status, reservation_token, expires_at, created_at, updated_at) VALUES `, 7, orders},
		{`INSERT INTO stock_reservations (token, sku, order_id, buyer, qty, state, result, expires_at, created_at, updated_at, campaign_id) VALUES `, 11, reservations},
		{`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta, reason, reference, created_at) VALUES `, 8, movements},
	} {
		first := strings.TrimSpace(strings.SplitN(strings.SplitN(ins.q, "(", 2)[1], ",", 2)[0])
		if err := c.exec(ctx, tx, ins.q+valuesOf(len(ids), ins.k)+" ON DUPLICATE KEY UPDATE "+first+" = "+first, ins.args...); err != nil {
			return err
		}
	}
	return c.exec(ctx, tx, `UPDATE skus SET projected_seq = ?, holds_dirty = CASE WHEN hold_seq > ? THEN 1 ELSE 0 END
		WHERE sku = ? AND projected_seq = ?`, last, last, "FLASH", projected)
}

// queryAll runs q on tx and scans each row.
func queryAll(ctx context.Context, tx costTx, scan func(*sql.Rows) error, q string, args ...any) error {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := scan(rows); err != nil {
			_ = rows.Close()
			return err
		}
	}
	return errors.Join(rows.Err(), rows.Close())
}

// designSales inserts the sales as one row each into table (d4, d5): the
// order's columns and the reservation's.
func designSales(table string, binary, keyed bool) costStep {
	return designRows(table, binary, keyed, ", sku, qty, res_state, result, buyer, campaign_id", "FLASH", 1, "HELD", 1000, nil, nil)
}

// arbitrate is what Reserve runs per batch besides its rows, with its
// arguments: the limits read, the conditional increment of the hot row, the
// fences read.
func arbitrate(ctx context.Context, _ *costRig, tx costTx, ids []string, _ time.Time) error {
	rows, err := tx.QueryContext(ctx, `SELECT sku, per_user_limit FROM skus WHERE sku IN (?) AND per_user_limit > 0`, "FLASH")
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, `UPDATE skus SET reserved = reserved + ?, seq = seq + 1, movement_position = movement_position + ?
		WHERE sku = ? AND (on_hand = -1 OR on_hand - reserved >= ?)`, len(ids), len(ids), "FLASH", len(ids))
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("the hot row refused %d", len(ids))
	}
	if rows, err = tx.QueryContext(ctx, `SELECT sku, seq, redis_epoch, movement_position FROM skus WHERE sku IN (?)`, "FLASH"); err != nil {
		return err
	}
	for rows.Next() {
		var sku string
		var seq, epoch, position int64
		if err := rows.Scan(&sku, &seq, &epoch, &position); err != nil {
			_ = rows.Close()
			return err
		}
	}
	return errors.Join(rows.Err(), rows.Close())
}

// arbitrateFolded is arbitrate with the hot row's statements folded
// (issue 43, item 6), as the group commit's writers send them since
// 2026-11-29 (arbiter.Reserve's takeStock, with the limit the writers
// keep: arbiter.LimitCache): the limit the batch's
// quotas were counted under is checked by the UPDATE itself
// (per_user_limit = the limit the writer last read with a fence; a SKU
// whose limit changed refuses the batch, which then reads the limits as
// arbitrate does), and the fence is read from the user variables the
// UPDATE set, not from the row: one statement on the table, one that
// reads no table.
func arbitrateFolded(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
	return arbitrateFoldedAs(ctx, tx, ids, false)
}

// arbitrateLean is arbitrateFolded as the lean sale sends it
// (INVENTORY_LEAN_SALE): the UPDATE also marks the SKU's holds left to
// project (holds_dirty, hold_seq; arbiter's takeStockSQL).
func arbitrateLean(ctx context.Context, c *costRig, tx costTx, ids []string, now time.Time) error {
	return arbitrateFoldedAs(ctx, tx, ids, true)
}

func arbitrateFoldedAs(ctx context.Context, tx costTx, ids []string, lean bool) error {
	held, args := "", []any{len(ids)}
	if lean {
		held, args = "holds_dirty = 1, hold_seq = movement_position + ?, ", append(args, len(ids))
	}
	res, err := tx.ExecContext(ctx, `UPDATE skus SET reserved = (@r0 := reserved + ?), seq = (@s0 := seq + 1), level_dirty = 1, `+held+`
			movement_position = (@p0 := movement_position + ?), redis_epoch = (@e0 := redis_epoch), on_hand = (@o0 := on_hand),
			low_stock_threshold = (@t0 := low_stock_threshold), event_flags = (@f0 := event_flags), event_seq = (@q0 := event_seq)
		WHERE sku = ? AND (on_hand = -1 OR on_hand - reserved >= ?) AND per_user_limit = ?`, append(args, len(ids), "FLASH", len(ids), 0)...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("the hot row refused %d", len(ids))
	}
	rows, err := tx.QueryContext(ctx, `SELECT @s0, @e0, @o0, @r0, @t0, @f0, @q0, @p0`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var seq, epoch, onHand, reserved, threshold, flags, eventSeq, position int64
		if err := rows.Scan(&seq, &epoch, &onHand, &reserved, &threshold, &flags, &eventSeq, &position); err != nil {
			_ = rows.Close()
			return err
		}
		if seq <= 0 || position <= 0 {
			_ = rows.Close()
			return fmt.Errorf("the fence read from the UPDATE's variables: seq %d, position %d", seq, position)
		}
	}
	return errors.Join(rows.Err(), rows.Close())
}

// costVariants: each row's index entries are its primary key and the
// secondary indexes of its table (orders 6 since the contract dropped
// orders_idempotency, order_items 1, reservations 4
// since migration 25's stock_reservations_campaign, movements 2; the
// designs' tables: designTables); round trips count BEGIN and COMMIT.
// TestCostVariantsCountWhatTheyWrite checks all three against the schema.
func costVariants() []costVariant {
	// A sale writes no order_items row: an order's lines are its
	// reservations. The sale with one is measured beside it, as it was.
	// The hot row's statements as the writers send them now: folded
	// (arbitrateFolded); sale2d15 is the sale as main sent it at 2d15ba2,
	// before they were.
	sale := []costStep{insertOrders, insertReservations, insertMovements, arbitrateFolded}
	sale2d15 := []costStep{insertOrders, insertReservations, insertMovements, arbitrate}
	before := []costStep{insertOrders, insertItems, insertReservations, insertMovements, arbitrate}
	return []costVariant{
		{name: "floor: one row, its primary key only", rows: 1, entries: 1, trips: 3, steps: []costStep{insertFloor}},
		{name: "orders row alone", rows: 1, entries: 6, trips: 3, steps: []costStep{insertOrders}},
		{name: "order_items row alone", rows: 1, entries: 1, trips: 3, steps: []costStep{insertItems}},
		{name: "stock_reservations row alone", rows: 1, entries: 4, trips: 3, steps: []costStep{insertReservations}},
		{name: "stock_movements row alone", rows: 1, entries: 2, trips: 3, steps: []costStep{insertMovements}},
		{name: "the hot row alone (limits read, UPDATE, fences read)", rows: 0, entries: 0, trips: 5, steps: []costStep{arbitrate}},
		{name: "the sale as main sent it at 137ab04 (with its order_items row; text; COMMIT, then the empty COMMIT)", rows: 4, entries: 13, trips: 10, steps: before, mode: twoStepTx},
		{name: "the sale without its order_items row, as text (COMMIT, then the empty COMMIT)", rows: 3, entries: 12, trips: 9, steps: sale2d15, mode: twoStepTx},
		{name: "the sale as main sent it at 2d15ba2 (limits read, UPDATE, fences read from the row; prepared on each writer's own connection; one COMMIT)", rows: 3, entries: 12, trips: 8, steps: sale2d15, mode: ownConn},
		{name: "a seckill sale with the order in the commit (INVENTORY_LEAN_SALE=false; the hot row's statements folded; prepared once on each writer's own connection; one COMMIT)", rows: 3, entries: 12, trips: 7, steps: sale, mode: ownConn},
		{name: "as main sent it at 137ab04, batches of varied size (same mean)", rows: 4, entries: 13, trips: 10, steps: before, mode: twoStepTx, varied: true},
		{name: "with the order in the commit, batches of varied size (same mean)", rows: 3, entries: 12, trips: 7, steps: sale, mode: ownConn, varied: true},
		{name: "the sale now without its RESERVE movement row too", rows: 2, entries: 10, trips: 6,
			steps: []costStep{insertOrders, insertReservations, arbitrateFolded}, mode: ownConn},
		{name: "orders row alone, a new buyer per sale", rows: 1, entries: 6, trips: 3, steps: []costStep{insertOrdersNewBuyers}},
		{name: "a seckill sale with the order in the commit, a new buyer per sale", rows: 3, entries: 12, trips: 7,
			steps: []costStep{insertOrdersNewBuyers, insertReservations, insertMovements, arbitrateFolded}, mode: ownConn},

		// The designs (designTables), each as the service sends the sale now,
		// and what any of them pays at least: the floor's row with the hot
		// row's statements in one commit, sent the same way.
		{name: "bound: the floor's row and the hot row's statements in one commit, prepared on each writer's connection (no design that arbitrates in the sale's commit writes less)", rows: 1, entries: 1, trips: 6,
			steps: []costStep{insertFloor, arbitrate}, mode: ownConn},
		{name: "design 1: Idempotency-Keys in their own table (orders without orders_idempotency; no key, no keys row)", rows: 3, entries: 12, trips: 8,
			steps: []costStep{designOrders("d1_orders", false, false), designReservations("d1_reservations", false), designMovements("d1_movements"), arbitrate}, mode: ownConn},
		{name: "design 2: 16-byte ids (orders.id, reservation token and order_id BINARY(16))", rows: 3, entries: 13, trips: 8,
			steps: []costStep{designOrders("d2_orders", true, true), designReservations("d2_reservations", true), designMovements("d2_movements"), arbitrate}, mode: ownConn},
		{name: "design 3: 1 + 2, no RESERVE movement row (the reservation is the record)", rows: 2, entries: 10, trips: 7,
			steps: []costStep{designOrders("d3_orders", true, false), designReservations("d3_reservations", true), arbitrate}, mode: ownConn},
		{name: "design 4: one row per sale, string ids, every index a query or uniqueness needs today (PRIMARY, orders' 6, (sku, res_state), (campaign_id, res_state, qty))", rows: 1, entries: 9, trips: 6,
			steps: []costStep{designSales("d4_sales", false, true), arbitrate}, mode: ownConn},
		{name: "design 4 lean: one row per sale, string ids, PRIMARY, (user_id, id), (status, expires_at), (created_at, id), (sku, res_state) only", rows: 1, entries: 5, trips: 6,
			steps: []costStep{designSales("d4_lean", false, false), arbitrate}, mode: ownConn},
		{name: "design 5: 4 with 16-byte ids, without orders_idempotency", rows: 1, entries: 8, trips: 6,
			steps: []costStep{designSales("d5_sales", true, false), arbitrate}, mode: ownConn},
		{name: "design 5 lean: 4 lean with 16-byte ids", rows: 1, entries: 5, trips: 6,
			steps: []costStep{designSales("d5_lean", true, false), arbitrate}, mode: ownConn},
		{name: "probe, not a product design: one row per sale, 16-byte ids, PRIMARY and (sku, res_state) only (no listing, no sweep index)", rows: 1, entries: 2, trips: 6,
			steps: []costStep{designSales("d6_probe", true, false), arbitrate}, mode: ownConn},

		// The hot row's statements folded (arbitrateFolded): the limits
		// read checked by the UPDATE, the fence read from its variables.
		{name: "the hot row alone, folded (UPDATE checking the limit, the fence from its variables)", rows: 0, entries: 0, trips: 4,
			steps: []costStep{arbitrateFolded}},
		{name: "bound, folded: the floor's row and the hot row's folded statements in one commit, prepared on each writer's connection", rows: 1, entries: 1, trips: 5,
			steps: []costStep{insertFloor, arbitrateFolded}, mode: ownConn},
		{name: "probe, folded: the probe's one row (two index entries) and the hot row's folded statements", rows: 1, entries: 2, trips: 5,
			steps: []costStep{designSales("d6_probe", true, false), arbitrateFolded}, mode: ownConn},
		// The lean sale as the service sends it with INVENTORY_LEAN_SALE
		// (issue 43): its projection is written after the commit.
		{name: "the lean sale as the service sends it (INVENTORY_LEAN_SALE, the default): the hot row's folded UPDATE marking the holds to project, one row of holds (two index entries); prepared on each writer's connection", rows: 1, entries: 2, trips: 5,
			steps: []costStep{arbitrateLean, insertLeanHolds}, mode: ownConn},
		{name: "the lean sale's commit and its projection (the projector's round over the batch's holds, in the same transaction: the orders, reservation and RESERVE movement rows written after the commit, counted here beside it)", rows: 4, entries: 14, trips: 13,
			steps: []costStep{arbitrateLean, insertLeanHolds, projectLean}, mode: ownConn},
	}
}

// dbCost runs every variant -dbcost-rounds times and returns the table.
func dbCost(ctx context.Context, dsnBase string) string {
	db := openDatabase(ctx, dsnBase, *dbPrefix+"_cost")
	defer db.Close()
	resetSchema(ctx, db)
	must(costSchema(ctx, db))
	vs := costVariants()
	var notes []string
	perSale := make([][]float64, len(vs))
	rates := make([][]float64, len(vs))
	ratios := make([][]float64, len(vs)) // to the floor of the same round
	d := max(*duration*3/5, time.Second)
	for round := range *costRounds {
		floor := 0.0 // the floor's µs per sale this round (vs[0]), 0 if not measured
		for i, v := range vs {
			name := fmt.Sprintf("dbcost %s #%d", v.name, round+1)
			prog.phase(name)
			rig := &costRig{db: db}
			must(emptyCostTables(ctx, db))
			before, ok := sampleCPU()
			sales, elapsed := costRun(ctx, rig, v, d)
			after, ok2 := sampleCPU()
			if v.mode == ownConn {
				notes = append(notes, fmt.Sprintf("round %d, %s: %d statements prepared, %d executed prepared, %d evicted",
					round+1, v.name, rig.prepared.Prepares, rig.prepared.Executions, rig.prepared.Evictions))
			}
			if !ok || !ok2 || sales == 0 {
				continue
			}
			cpu := float64(after.group["mariadbd"]-before.group["mariadbd"]) / userHZ
			us := cpu * 1e6 / float64(sales)
			perSale[i] = append(perSale[i], us)
			rates[i] = append(rates[i], float64(sales)/elapsed.Seconds())
			if i == 0 {
				floor = us
			}
			if floor > 0 {
				ratios[i] = append(ratios[i], us/floor)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| the database's cost of a sale, %d sales per group commit, %d writers, no HTTP | rows per sale | index entries per sale | round trips per commit | sales/s | MariaDB CPU µs per sale, median of %d rounds (min–max) |\n|---|---:|---:|---:|---:|---:|\n",
		*costBatch, floorWriters, *costRounds)
	for i, v := range vs {
		if len(perSale[i]) == 0 {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | – | – |\n", v.name, v.rows, v.entries, v.trips)
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %.0f | %.1f (%.1f–%.1f) |\n", v.name, v.rows, v.entries, v.trips,
			median(rates[i]), median(perSale[i]), slices.Min(perSale[i]), slices.Max(perSale[i]))
	}
	b.WriteString("\nEach variant writes the statements named with the columns the service's group commit writes; " +
		"\"alone\" rows include their commit (BEGIN, the INSERT, COMMIT), so the parts do not add up to the sale.\n")
	b.WriteString(costTargets(vs, perSale, ratios))
	b.WriteString(serverState(ctx, db))
	for _, n := range notes {
		b.WriteString("\n- " + n)
	}
	b.WriteString("\n")
	return b.String()
}

// serverState is the database server's state that a sale's cost depends
// on beyond the statements (issue 43: a shared server that kept every
// run's tables past its buffer pool measured half again more per sale
// than a fresh one): the buffer pool, and the InnoDB data it holds for
// this run and for every schema, so two runs' tables can be compared.
func serverState(ctx context.Context, db *sql.DB) string {
	var pool, free, total, dirty int64
	var version string
	q := func(dst any, query string) {
		if err := db.QueryRowContext(ctx, query).Scan(dst); err != nil {
			must(fmt.Errorf("benchtable: the server's state: %s: %w", query, err))
		}
	}
	status := func(dst *int64, name string) {
		q(dst, "SELECT variable_value FROM information_schema.global_status WHERE variable_name = '"+name+"'")
	}
	q(&version, `SELECT VERSION()`)
	q(&pool, `SELECT @@innodb_buffer_pool_size`)
	status(&free, "INNODB_BUFFER_POOL_PAGES_FREE")
	status(&total, "INNODB_BUFFER_POOL_PAGES_TOTAL")
	status(&dirty, "INNODB_BUFFER_POOL_PAGES_DIRTY")
	var here, all, schemas int64
	q(&here, `SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables WHERE table_schema = DATABASE() AND engine = 'InnoDB'`)
	q(&all, `SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables WHERE engine = 'InnoDB'`)
	q(&schemas, `SELECT COUNT(DISTINCT table_schema) FROM information_schema.tables WHERE engine = 'InnoDB'`)
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	return fmt.Sprintf("\nThe server after the rounds: %s; buffer pool %.0f MiB (%d of %d pages free, %d dirty); "+
		"InnoDB tables %.1f MiB in this run's schema, %.1f MiB in all %d schemas (information_schema's estimates).\n",
		version, mib(pool), free, total, dirty, mib(here), mib(all), schemas)
}

// Issue 33's target for the database's cost of a durable sale.
const (
	targetMicros = 50.0 // MariaDB CPU µs per sale at most
	targetRatio  = 2.5  // and at most this many floors measured beside it
)

// costTargets is each variant against issue 33's target: its µs per sale
// (median) and its ratio to the floor of the same round, median over the
// rounds (min–max), unrounded in the verdicts.
func costTargets(vs []costVariant, perSale, ratios [][]float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n| against issue 33's target (≤ %.0f µs and ≤ %.1f× the floor) | index entries per sale | MariaDB CPU µs per sale, median | × the floor of the same round, median of the rounds (min–max) | ≤ %.0f µs | ≤ %.1f× |\n|---|---:|---:|---:|---|---|\n",
		targetMicros, targetRatio, targetMicros, targetRatio)
	for i, v := range vs {
		if len(perSale[i]) == 0 || len(ratios[i]) == 0 {
			fmt.Fprintf(&b, "| %s | %d | – | – | – | – |\n", v.name, v.entries)
			continue
		}
		us, r := median(perSale[i]), median(ratios[i])
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.2f× (%.2f–%.2f) | %s | %s |\n", v.name, v.entries, us,
			r, slices.Min(ratios[i]), slices.Max(ratios[i]), yesNo(us <= targetMicros), yesNo(r <= targetRatio))
	}
	b.WriteString("\nThe ratio divides each round's measurement by the floor's of the same round (the floor runs first in each), " +
		"so a stretch of load that lands on one round moves both; its median is not the ratio of the medians.\n")
	return b.String()
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// costSchema adds to a migrated database what the variants write besides
// the service's tables: the floor's table, the designs' tables and the
// hot SKU.
func costSchema(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE floor_sales (id VARCHAR(40) NOT NULL PRIMARY KEY, qty INT NOT NULL)
		ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`); err != nil {
		return err
	}
	for _, q := range designTables {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	_, err := db.ExecContext(ctx, `INSERT INTO skus (sku, on_hand, reserved) VALUES ('FLASH', ?, 0)`, hotStock)
	return err
}

// emptyCostTables empties every table of the cost database but the SKUs
// and the migrations' own, so each variant writes tables of the same size
// whatever ran before it: left to grow, the orders and reservations tables
// that most variants share outgrew the buffer pool (256 MiB, 1M rows and
// ~1 GB by a run's end) while each design's own tables stayed small, and a
// variant's cost said more about its place in the round than its rows.
func emptyCostTables(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	rows, err := conn.QueryContext(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' AND table_name NOT IN ('skus', 'goose_db_version')`)
	if err != nil {
		return err
	}
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			_ = rows.Close()
			return err
		}
		tables = append(tables, t)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "SET FOREIGN_KEY_CHECKS = 0"); err != nil {
		return err
	}
	for _, t := range tables {
		if _, err := conn.ExecContext(ctx, "TRUNCATE TABLE `"+t+"`"); err != nil {
			return err
		}
	}
	_, err = conn.ExecContext(ctx, "SET FOREIGN_KEY_CHECKS = 1")
	return err
}

// costRun group-commits batches of v's rows from floorWriters writers for d
// and returns how many sales they committed.
func costRun(ctx context.Context, rig *costRig, v costVariant, d time.Duration) (int64, time.Duration) {
	var sales atomic.Int64
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range floorWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var own *prepconn.Conn
			if v.mode == ownConn {
				own = prepconn.New(rig.db, prepconn.Config{})
				defer func() {
					st := own.Stats()
					must(own.Close())
					rig.mu.Lock()
					rig.prepared = rig.prepared.Add(st)
					rig.mu.Unlock()
				}()
			}
			all := make([]string, 2*(*costBatch)-1)
			for k := 0; time.Now().Before(stop); k++ {
				ids := all[:*costBatch]
				if v.varied { // 1, 8, 15, 22, 29, 7, 14, ... for 15: every size once in 29 commits
					ids = all[:1+(7*k)%len(all)]
				}
				for i := range ids {
					ids[i] = uuid.Must(uuid.NewV7()).String()
				}
				must(costCommit(ctx, rig, v, own, ids, nil))
				sales.Add(int64(len(ids)))
			}
		}()
	}
	wg.Wait()
	return sales.Load(), time.Since(start)
}

// costCommit writes one group commit of v's rows for the sales ids: on
// own (mode ownConn) or the pool. wrap, when not nil, stands between the
// steps and the transaction (the test counts the statements through it).
func costCommit(ctx context.Context, rig *costRig, v costVariant, own *prepconn.Conn, ids []string, wrap func(costTx) costTx) error {
	now := time.Now().UTC().Truncate(time.Microsecond)
	var tx interface {
		costTx
		Rollback() error
	}
	var commit func() error
	if own != nil {
		t, err := own.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		tx, commit = t, func() error { return t.CommitContext(ctx) }
	} else {
		t, err := rig.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		tx, commit = t, t.Commit
		if v.mode == twoStepTx {
			commit = func() error {
				if _, err := t.ExecContext(ctx, "COMMIT"); err != nil {
					return err
				}
				return t.Commit()
			}
		}
	}
	var steps costTx = tx
	if wrap != nil {
		steps = wrap(tx)
	}
	for _, step := range v.steps {
		if err := step(ctx, rig, steps, ids, now); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("%s: %w", v.name, err)
		}
	}
	return commit()
}
