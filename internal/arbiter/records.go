// Package arbiter is where the database arbitrates every quantity: the one
// owner of each statement that changes a SKU's on_hand or reserved, a
// reservation's state or a buyer's quota (see Arbiter), and the records
// those statements write, the stock outbox among them (Outbox), and what
// retention may prune of them (retention.go). Redis (package stock) admits;
// this package decides. The order lifecycle (package order), the sync path
// (internal/stocksync) and maintenance (internal/maintenance) say what
// happened; none of them writes these rows itself.
package arbiter

import (
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/acme/inventory"
	"gorm.io/gorm"
)

// RefusedError: the database cannot cover a reservation of SKU (Redis
// admitted it wrongly). Callers turn it into inventory.ErrInsufficientStock.
type RefusedError struct{ SKU string }

func (e RefusedError) Error() string { return "order: the database refused a reservation of " + e.SKU }

// The per-user limit is arbitrated like stock: buyer_quotas holds what each
// buyer holds or bought of each limited SKU, and a reservation counts there
// in the transaction that records it, under a conditional increment. Redis
// only pre-filters seckill buyers (the admission script counts them) and may
// forget; the database does not. A release (cancel, timeout) gives the units
// back.

// OverLimitError: the reservation would take a buyer past the SKU's per-user
// limit. It is a conflict.
type OverLimitError struct {
	SKU, User string
	Limit     int64
}

func (e OverLimitError) Error() string {
	return fmt.Sprintf("buyer %s reached the per-user limit of %d for %s", e.User, e.Limit, e.SKU)
}

func (e OverLimitError) Unwrap() error { return inventory.ErrConflict }

// BuyerUnits is a quantity of SKU counted against User's limit.
type BuyerUnits struct {
	SKU, User string
	Qty       int64
}

// MaxStock bounds a SKU's stock (and a single adjustment).
const MaxStock = 1_000_000_000_000

// SKU is a SKU's durable record: its quantity states and settings.
type SKU struct {
	SKU          string `gorm:"primaryKey;column:sku"`
	OnHand       int64  `gorm:"column:on_hand"`
	Reserved     int64  `gorm:"column:reserved"`
	Seq          int64  `gorm:"column:seq"`
	RedisEpoch   int64  `gorm:"column:redis_epoch"`
	PerUserLimit int64  `gorm:"column:per_user_limit"`
	// LowStockThreshold is the available level at or below which the SKU
	// is low (sku.low_stock); 0: never.
	LowStockThreshold int64 `gorm:"column:low_stock_threshold"`
}

func (SKU) TableName() string { return "skus" }

// Version names a SKU's stock settings for optimistic concurrency (an
// operator's If-Match): it changes when on_hand, per_user_limit or
// low_stock_threshold changes (a put or an adjust, a sale or a refund
// applied), not when units are reserved or released, so an operator's
// write is not refused because buyers are buying; two settings that are
// equal have one version. A SKU without a threshold keeps the version it
// had before thresholds existed.
func (s SKU) Version() string {
	if s.LowStockThreshold != 0 {
		return fmt.Sprintf("%d.%d.%d", s.OnHand, s.PerUserLimit, s.LowStockThreshold)
	}
	return fmt.Sprintf("%d.%d", s.OnHand, s.PerUserLimit)
}

// Available is on_hand - reserved, or inventory.Unlimited.
func (s SKU) Available() int64 {
	if s.OnHand == inventory.Unlimited {
		return inventory.Unlimited
	}
	return s.OnHand - s.Reserved
}

// AnyVersion in a Put's or Adjust's versions matches any existing SKU.
const AnyVersion = "*"

// matches reports whether the SKU's current version is one of ifMatch (no
// versions: no condition); cur is nil when there is no such SKU.
func matches(cur *SKU, ifMatch []string) bool {
	if len(ifMatch) == 0 {
		return true
	}
	return cur != nil && (slices.Contains(ifMatch, AnyVersion) || slices.Contains(ifMatch, cur.Version()))
}

// Adjustment is an adjust that carried a reference: applied once per SKU.
type Adjustment struct {
	SKU       string `gorm:"primaryKey;column:sku"`
	Reference string `gorm:"primaryKey"`
	Delta     int64
	Reason    string
	CreatedAt time.Time
}

func (Adjustment) TableName() string { return "stock_adjustments" }

// ResState is a reservation's state. A reservation resolves at most once:
//
//	HELD -> COMMITTED -> SOLD   (paid; the ordered MQ deducted on_hand)
//	SOLD -> RESTORED            (refunded; the ordered MQ gave the units back)
//	HELD -> RELEASED            (cancel, timeout, release)
//
// The state is never pruned: it is what says whether a deduction or a
// restore was applied, however late a duplicate arrives.
//
// HELD and COMMITTED rows are live: skus.reserved is the sum of their qty.
type ResState string

const (
	Held      ResState = "HELD"
	Committed ResState = "COMMITTED"
	Sold      ResState = "SOLD"
	Restored  ResState = "RESTORED"
	Released  ResState = "RELEASED"
)

// Reservation is one arbitrated reservation: an order line, or a raw
// reservation of the token API (Token "t." + the client's token, OrderID nil).
type Reservation struct {
	Token   string  `gorm:"primaryKey"`
	SKU     string  `gorm:"primaryKey;column:sku"`
	OrderID *string `gorm:"column:order_id"`
	// Buyer is the user this reservation counts against in buyer_quotas
	// (nil: it does not count).
	Buyer     *string  `gorm:"column:buyer"`
	Qty       int64    `gorm:"column:qty"`
	State     ResState `gorm:"column:state"`
	Result    int64    `gorm:"column:result"`
	ExpiresAt time.Time
	CreatedAt time.Time
	UpdatedAt time.Time
	// ExtendKey is the Idempotency-Key of the extension that moved
	// ExpiresAt last (token API; nil: none).
	ExtendKey *string `gorm:"column:extend_key"`
	// CampaignID names the campaign whose pool this sale came from (and
	// the pool itself); nil outside campaigns.
	CampaignID *string `gorm:"column:campaign_id"`
}

func (Reservation) TableName() string { return "stock_reservations" }

// Fence is where a SKU's change of available units landed: its seq, and the
// Redis epoch the database knew then. Limit is, for a reservation, the
// per-user limit its buyer was counted against (0: the buyer was not
// counted), so Redis's buyers hash can follow.
type Fence struct {
	Seq, Epoch int64
	Limit      int64
}

// SKUExists reports whether sku has a record.
func SKUExists(tx *gorm.DB, sku string) (bool, error) { return In(tx).skuExists(sku) }

// skuExists reports whether sku has a record, asked in the arbiter's
// transaction.
func (a Arbiter) skuExists(sku string) (bool, error) {
	var n int64
	err := a.query(func(rows *sql.Rows) error { return rows.Scan(&n) }, "SELECT count(*) FROM `skus` WHERE sku = ?", sku)
	return n == 1, err
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Freed is what a release gave back: the changes for Redis, the units per
// SKU, and the units given back to buyers' per-user limits.
type Freed struct {
	Changes []inventory.Change
	Units   map[string]int64
	Quotas  []BuyerUnits
	// Campaigns are the units that went back to live campaigns' pools
	// (not to their SKUs), and CampaignQuotas the campaign limits' counts
	// given back.
	Campaigns      []CampaignChange
	CampaignQuotas []CampaignUnits
	// Ended are the campaigns whose pools the release released (their end):
	// nothing of them is needed in Redis any more.
	Ended []CampaignRef
}

// CampaignRef names a campaign and the SKU it sells.
type CampaignRef struct{ ID, SKU string }

// CampaignUnits is a quantity of a campaign's sales counted against User's
// per-campaign limit.
type CampaignUnits struct {
	ID, SKU, User string
	Qty           int64
}

// Changes turns per-SKU quantities and their fences into Redis changes of
// sign * qty.
func Changes(qty map[string]int64, fences map[string]Fence, sign int64) []inventory.Change {
	out := make([]inventory.Change, 0, len(qty))
	for _, sku := range sortedKeys(qty) {
		out = append(out, inventory.Change{SKU: sku, Delta: sign * qty[sku], Seq: fences[sku].Seq})
	}
	return out
}

// Op is a stock operation carried to the database.
type Op string

const (
	OpDeduct  Op = "DEDUCT"  // a paid line leaves the stock
	OpRestore Op = "RESTORE" // a refunded line comes back
	// OpMalformed is the op of an anomaly recorded for a message that could
	// not be decoded into a stock operation.
	OpMalformed Op = "MALFORMED"
)

// OutboxRow is a stock operation waiting to be published; written in the
// transaction of the order transition that causes it.
type OutboxRow struct {
	ID        int64      `gorm:"primaryKey"`
	Token     string     `gorm:"column:token"` // the reservation's token
	SKU       string     `gorm:"column:sku"`
	Op        Op         `gorm:"column:op"`
	Qty       int64      `gorm:"column:qty"`
	CreatedAt time.Time  `gorm:"column:created_at;autoCreateTime:false;default:CURRENT_TIMESTAMP(6)"`
	SentAt    *time.Time `gorm:"column:sent_at"`
}

func (OutboxRow) TableName() string { return "stock_outbox" }

// StockMessage is the body of one message on the ordered topic (key = SKU):
// an operation on the reservation (Token, SKU).
type StockMessage struct {
	Token string `json:"token"`
	SKU   string `json:"sku"`
	Op    Op     `json:"op"`
	Qty   int64  `json:"qty"`
}

// LedgerRow is one applied operation.
type LedgerRow struct {
	ID    int64  `gorm:"primaryKey"`
	Token string `gorm:"column:token"`
	SKU   string `gorm:"column:sku"`
	Op    Op     `gorm:"column:op"`
	Qty   int64  `gorm:"column:qty"`
}

func (LedgerRow) TableName() string { return "stock_ledger" }

// AnomalyRow is an operation the applier refused.
type AnomalyRow struct {
	ID     int64  `gorm:"primaryKey"`
	Token  string `gorm:"column:token"`
	SKU    string `gorm:"column:sku"`
	Op     Op     `gorm:"column:op"`
	Qty    int64  `gorm:"column:qty"`
	OnHand int64  `gorm:"column:on_hand"`
	Reason string `gorm:"column:reason"`
}

func (AnomalyRow) TableName() string { return "stock_anomalies" }

type opKey struct {
	token, sku string
	op         Op
}

// Delivery is what settling one delivery of the ordered consumer did.
type Delivery struct {
	Applied, Duplicate int64
	Anomalies          []AnomalyRow       // to record
	Changes            []inventory.Change // restores, for Redis
}

// MovementKind says why a SKU's quantities moved.
type MovementKind string

const (
	MoveReserve    MovementKind = "RESERVE"    // a reservation: reserved +qty
	MoveRelease    MovementKind = "RELEASE"    // cancel, timeout, release: reserved -qty
	MoveSale       MovementKind = "SALE"       // a paid reservation applied: on_hand and reserved -qty
	MoveRefund     MovementKind = "REFUND"     // a refund applied: on_hand +qty
	MoveRestock    MovementKind = "RESTOCK"    // an adjust with delta > 0
	MoveCorrection MovementKind = "CORRECTION" // an adjust with delta < 0, or a reconcile repair
	MoveSet        MovementKind = "SET"        // the admin PUT that sets on_hand outright
	MoveCount      MovementKind = "COUNT"      // a stock count's correction, rebased to when it was counted (counts.go)
)

// Movement is one immutable change of a SKU's on_hand and reserved, written in
// the transaction of the change. Nothing updates one: a mistake is fixed by a
// correcting movement, so per SKU the sums of the deltas are on_hand and
// reserved (counting from the SKU's first movement), and the history is the
// audit trail. The one deletion is retention's, through FoldMovements: old
// movements become one opening balance with the same sums.
//
// Position is the movement's place in its SKU's history: 1, 2, 3, ... with
// no gap, in the order the changes committed. It comes from the SKU's row
// (skus.movement_position), which the change's own UPDATE bumps under the
// row lock, so a movement that commits later is numbered after every one
// that committed before it: a reader that reads on from the last position
// it has never skips one. ID only names the row.
type Movement struct {
	ID            int64        `json:"id" gorm:"primaryKey"`
	SKU           string       `json:"sku" gorm:"column:sku"`
	Position      int64        `json:"position" gorm:"column:position"`
	Kind          MovementKind `json:"kind" gorm:"column:kind"`
	OnHandDelta   int64        `json:"on_hand_delta" gorm:"column:on_hand_delta"`
	ReservedDelta int64        `json:"reserved_delta" gorm:"column:reserved_delta"`
	Reason        string       `json:"reason" gorm:"column:reason"`
	// Reference is what caused the movement: an order id, "token:" + a token
	// API token, or the reference an adjust carried (a purchase order).
	Reference string    `json:"reference" gorm:"column:reference"`
	CreatedAt time.Time `json:"created_at"`
}

func (Movement) TableName() string { return "stock_movements" }

// positions are, per SKU, the position of its last movement as a change
// left skus.movement_position (bumped by the change's UPDATE, read under
// its row lock).
type positions map[string]int64

// insertMovements numbers ms and writes them in tx, in one multi-row
// INSERT (their ids are the database's; nothing reads them back). A SKU's
// movements in ms are its last ones, in their order: the n of them take the
// positions last[sku]-n+1 to last[sku], as the change's UPDATE counted
// them. A count that disagrees shows as a position taken twice, which the
// unique key (sku, position) refuses. A movement's created_at is now, this
// node's clock, unless the caller set it: Settle stamps a sale's movement
// and its stock_shipping row with one time, which a count's rebase
// compares alike.
func (a Arbiter) insertMovements(ms []Movement, last positions) error {
	if len(ms) == 0 {
		return nil
	}
	if err := numberMovements(ms, last); err != nil {
		return err
	}
	return a.insertNumbered(ms)
}

// numberMovements gives ms their positions and times as insertMovements
// writes them.
func numberMovements(ms []Movement, last positions) error {
	left := map[string]int64{}
	for _, m := range ms {
		left[m.SKU]++
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	for i := range ms {
		ms[i].CreatedAt = stamp(ms[i].CreatedAt, now)
		ms[i].Position = last[ms[i].SKU] - left[ms[i].SKU] + 1
		left[ms[i].SKU]--
		if ms[i].Position < 1 {
			return fmt.Errorf("arbiter: a movement of %s numbered %d: its change did not count it", ms[i].SKU, ms[i].Position)
		}
	}
	return nil
}

// insertNumbered writes movements numberMovements numbered.
func (a Arbiter) insertNumbered(ms []Movement) error {
	args := make([]any, 0, len(ms)*len(movementColumns))
	for _, m := range ms {
		args = append(args, m.SKU, m.Position, m.Kind, m.OnHandDelta, m.ReservedDelta, m.Reason, m.Reference, m.CreatedAt)
	}
	return a.insertRows("stock_movements", movementColumns, args)
}

// movementCounts is how many movements of each SKU ms holds: what the
// change's UPDATE adds to the SKU's movement_position.
func movementCounts(ms []Movement) map[string]int64 {
	n := map[string]int64{}
	for _, m := range ms {
		n[m.SKU]++
	}
	return n
}

// reservationMovements is one movement of kind per reservation row, moving
// reserved by sign * qty.
func reservationMovements(rows []Reservation, kind MovementKind, sign int64) []Movement {
	out := make([]Movement, 0, len(rows))
	for _, r := range rows {
		ref := tokenRef(r.Token)
		if r.OrderID != nil {
			ref = *r.OrderID
		}
		out = append(out, Movement{SKU: r.SKU, Kind: kind, ReservedDelta: sign * r.Qty, Reference: ref})
	}
	return out
}

// tokenRef names a reservation token as a movement's reference: a token API
// token ("t." + the client's) as "token:" + the client's token, an order's
// token (its id, or id + ".late" for a late payment's re-reservation) as the
// order id.
func tokenRef(token string) string {
	if tok, ok := strings.CutPrefix(token, "t."); ok {
		return "token:" + tok
	}
	if id, ok := strings.CutPrefix(token, "c:"); ok {
		return "campaign:" + id
	}
	return strings.TrimSuffix(token, ".late")
}
