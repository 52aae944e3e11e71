package maintenance

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/stock"
)

// Reconciler compares Redis with the database and the database with itself,
// and repairs what it may: Redis from the database (realign), reserved from
// the live reservations (through the arbiter). Anomalies it only reports:
// they need an operator.
type Reconciler struct {
	db    *gorm.DB
	stock *stock.Store
	log   *slog.Logger
	// settle is how long the realign watches a pool that is only behind the
	// database before it moves it (see Realign), and wait how it waits.
	settle time.Duration
	wait   func(ctx context.Context, d time.Duration)
}

// DefaultSettle is the realign's settle when none is given: longer than an
// admission stays in flight under the service's default request deadline
// (1 s) and stock.FollowUpGrace.
const DefaultSettle = 2 * time.Second

func NewReconciler(db *gorm.DB, st *stock.Store, log *slog.Logger) *Reconciler {
	if log == nil {
		log = slog.Default()
	}
	return &Reconciler{db: db, stock: st, log: log, settle: DefaultSettle,
		wait: func(ctx context.Context, d time.Duration) { job.Sleep(ctx, d, nil) }}
}

// WithSettle sets how long the realign watches a pool that is only behind
// the database before it moves it: at least the longest an admission can
// stay in flight (Redis took the units, the database has neither recorded
// nor refused them, nor has the refusal given them back): the request
// deadline and stock.FollowUpGrace. d <= 0 keeps DefaultSettle.
func (c *Reconciler) WithSettle(d time.Duration) *Reconciler {
	if d > 0 {
		c.settle = d
	}
	return c
}

// Settle is how long the realign watches a pool that is only behind the
// database before it moves it.
func (c *Reconciler) Settle() time.Duration { return c.settle }

// Report is one SKU where Redis and the database disagree, or where the
// database disagrees with itself.
type Report struct {
	SKU            string `json:"sku"`
	OnHand         int64  `json:"on_hand"`
	Reserved       int64  `json:"reserved"`
	Live           int64  `json:"live_reservations"` // sum of HELD and COMMITTED rows
	Available      int64  `json:"available"`
	RedisAvailable *int64 `json:"redis_available"` // nil: not initialised
	// BuyersDiffer is how many buyers Redis's per-user count (the buyers
	// hash) has otherwise than buyer_quotas (with a per-user limit; none
	// without), all of them when the hash comes from another initialisation
	// than the stock; 0 when the hash is not initialised (lost: Redis
	// initialises it again before it uses it).
	BuyersDiffer int64  `json:"buyers_differ"`
	Anomalies    int64  `json:"anomalies"` // unresolved rows in stock_anomalies
	Problem      string `json:"problem"`
	Repaired     bool   `json:"repaired"`
}

// Reconcile checks every SKU: Redis's available against on_hand - reserved,
// Redis's per-user counts against buyer_quotas, reserved against the sum of
// live reservations, and unresolved anomalies. With repair it realigns Redis
// from the database (level and counts; exact even under traffic) and sets
// reserved to the live sum where they differ. Redis numbers are exact at a
// quiet point; under traffic an admission in flight shows as a difference
// of its units.
func (c *Reconciler) Reconcile(ctx context.Context, repair bool) ([]Report, error) {
	var out []Report
	err := c.eachSKU(ctx, func(rec arbiter.SKU, lv stock.Levels) error {
		r, err := c.check(ctx, rec, lv, repair)
		if r != nil {
			out = append(out, *r)
		}
		return err
	})
	if err != nil {
		return out, err
	}
	orphans, err := c.orphanAnomalies(ctx)
	return append(out, orphans...), err
}

// orphanAnomalies reports the unresolved anomalies of no known SKU (an
// operation on an unknown SKU, a message that named none), per SKU name.
func (c *Reconciler) orphanAnomalies(ctx context.Context) ([]Report, error) {
	var rows []struct {
		SKU string `gorm:"column:sku"`
		N   int64  `gorm:"column:n"`
	}
	if err := c.db.WithContext(ctx).Raw(`SELECT a.sku, COUNT(*) AS n FROM stock_anomalies a
		WHERE a.resolved_at IS NULL AND NOT EXISTS (SELECT 1 FROM skus s WHERE s.sku = a.sku)
		GROUP BY a.sku ORDER BY a.sku`).Scan(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]Report, len(rows))
	for i, r := range rows {
		out[i] = Report{SKU: r.SKU, Anomalies: r.N, Problem: "anomalies (no such sku)"}
	}
	return out, nil
}

// eachSKU calls fn with every SKU's record and Redis levels, in SKU order,
// a page of 500 at a time (one query and one Redis round trip per page).
func (c *Reconciler) eachSKU(ctx context.Context, fn func(arbiter.SKU, stock.Levels) error) error {
	after := ""
	for {
		var recs []arbiter.SKU
		if err := c.db.WithContext(ctx).Where("sku > ?", after).Order("sku").Limit(500).Find(&recs).Error; err != nil {
			return err
		}
		if len(recs) == 0 {
			return nil
		}
		after = recs[len(recs)-1].SKU
		skus := make([]string, len(recs))
		for i, rec := range recs {
			skus[i] = rec.SKU
		}
		lvs, err := c.stock.LevelsOf(ctx, skus)
		if err != nil {
			return err
		}
		for i, rec := range recs {
			if err := fn(rec, lvs[i]); err != nil {
				return err
			}
		}
	}
}

func (c *Reconciler) check(ctx context.Context, rec arbiter.SKU, lv stock.Levels, repair bool) (*Report, error) {
	var live, anomalies int64
	db := c.db.WithContext(ctx)
	// The SKU's holds only the lean sale recorded yet are counted too:
	// projected first (harmless twice), its campaigns' counted as they are.
	if err := arbiter.Transact(ctx, c.db, func(tx *gorm.DB) (err error) {
		if err := arbiter.In(tx).ProjectSKU(rec.SKU); err != nil {
			return err
		}
		live, err = arbiter.In(tx).Live(rec.SKU)
		return err
	}); err != nil {
		return nil, err
	}
	if err := db.Model(&arbiter.AnomalyRow{}).Where("sku = ? AND resolved_at IS NULL", rec.SKU).Count(&anomalies).Error; err != nil {
		return nil, err
	}
	r := Report{SKU: rec.SKU, OnHand: rec.OnHand, Reserved: rec.Reserved, Live: live, Available: rec.Available(), Anomalies: anomalies}
	var problems []string
	if lv.Initialised {
		r.RedisAvailable = &lv.Available
		if lv.Available != rec.Available() {
			problems = append(problems, "redis")
		}
		n, err := c.buyersDiffer(ctx, rec, lv)
		if err != nil {
			return nil, err
		}
		if r.BuyersDiffer = n; n > 0 {
			problems = append(problems, "buyers")
		}
	}
	if live != rec.Reserved {
		problems = append(problems, "reserved")
	}
	if anomalies > 0 {
		problems = append(problems, "anomalies")
	}
	if len(problems) == 0 {
		return nil, nil
	}
	r.Problem = strings.Join(problems, ",")
	if repair && !(len(problems) == 1 && problems[0] == "anomalies") {
		if live != rec.Reserved {
			if err := c.fixReserved(ctx, rec.SKU); err != nil {
				return nil, err
			}
		}
		if lv.Initialised {
			if err := c.stock.Realign(ctx, rec.SKU); err != nil {
				return nil, err
			}
		}
		r.Repaired = true
	}
	return &r, nil
}

// buyersDiffer counts the buyers whose count in Redis's buyers hash is not
// the database's: every buyer of the hash when it comes from another
// initialisation than the stock's, none when it is not initialised.
func (c *Reconciler) buyersDiffer(ctx context.Context, rec arbiter.SKU, lv stock.Levels) (int64, error) {
	inRedis, epoch, err := c.stock.Buyers(ctx, rec.SKU)
	if err != nil || epoch == 0 {
		return 0, err
	}
	if epoch != lv.Epoch {
		return max(int64(len(inRedis)), 1), nil
	}
	inDB := map[string]int64{}
	if rec.PerUserLimit > 0 {
		if inDB, err = arbiter.In(c.db.WithContext(ctx)).Buyers(rec.SKU); err != nil {
			return 0, err
		}
	}
	var n int64
	for u, q := range inDB {
		if inRedis[u] != q {
			n++
		}
	}
	for u := range inRedis {
		if _, ok := inDB[u]; !ok {
			n++
		}
	}
	return n, nil
}

// fixReserved has the arbiter set reserved to the sum of live reservations.
func (c *Reconciler) fixReserved(ctx context.Context, sku string) error {
	return arbiter.Transact(ctx, c.db, func(tx *gorm.DB) error { return arbiter.In(tx).FixReserved(sku) })
}

// Realign realigns every SKU whose Redis value differs from the database's,
// or whose Redis value comes from another initialisation than the last one
// the database numbered, or whose buyers hash comes from another
// initialisation than its value (the periodic job): a Redis restored from a
// snapshot older than the SKU's last init, or failed over to a replica that
// missed it, is found even where its number happens to match. A realign
// restores the buyers' counts with the level. It returns the SKUs it
// realigned. (It does not compare each buyer's count, which costs a row per
// buyer: reconcile does.)
//
// It does not fight a live sale. An admission in flight (Redis took the
// units; the database has not recorded them yet) leaves Redis behind the
// database for a moment, and realigning then would count those units as
// available again (each refused sale then asks for another realign). So a
// SKU that is only behind, with the epoch the database numbered, is
// realigned only when neither store moved while the realign watched it for
// the settle (WithSettle: longer than an admission stays in flight): the
// database's seq (every recorded sale, release or change bumps it) and
// Redis's value and epoch (every admission and give-back moves them) stood
// still, so nothing was in flight and the difference is real (units an
// admission took whose process died, a give-back Redis lost). One that
// moved is left for the next round. Whatever else differs (Redis ahead of
// the database: in-flight admissions only ever put it behind; another
// epoch; buyers' counts of another initialisation) is realigned at once.
// While a SKU keeps selling, units hidden by a real drift stay hidden until
// it stops: at the latest when Redis runs out, whose refusals move
// nothing, so no buyer is refused for them longer than a round and the
// settle.
func (c *Reconciler) Realign(ctx context.Context) ([]string, error) {
	var done []string
	var behind []skuSample
	err := c.eachSKU(ctx, func(rec arbiter.SKU, lv stock.Levels) error {
		switch drift(rec, lv) {
		case aligned:
			// The counts too, buyer by buyer: a Redis failed over to a
			// replica that missed some of them keeps the right marks.
			n, err := c.buyersDiffer(ctx, rec, lv)
			if err != nil || n == 0 {
				return err
			}
		case behindDB:
			behind = append(behind, skuSample{rec, lv})
			return nil
		case notInRedis:
			return nil
		}
		if err := c.stock.Realign(ctx, rec.SKU); err != nil {
			return err
		}
		done = append(done, rec.SKU)
		return nil
	})
	if err != nil || len(behind) == 0 {
		return done, err
	}
	still, err := c.stoodStill(ctx, behind)
	for _, sku := range still {
		if err := c.stock.Realign(ctx, sku); err != nil {
			return done, err
		}
		done = append(done, sku)
	}
	return done, err
}

// How a pool's copy in Redis stands against the database (drift).
type standing int

const (
	aligned    standing = iota // same value, same initialisation
	notInRedis                 // Redis has none: its next use initialises it
	behindDB                   // fewer units than the database, same initialisation: maybe admissions in flight
	wrong                      // anything else: realigned at once
)

// drift says how sku's Redis levels lv stand against its record rec.
func drift(rec arbiter.SKU, lv stock.Levels) standing {
	switch {
	case !lv.Initialised:
		return notInRedis
	case lv.Epoch != rec.RedisEpoch || lv.BuyersEpoch != 0 && lv.BuyersEpoch != lv.Epoch:
		return wrong
	case lv.Available == rec.Available():
		return aligned
	case lv.Available < rec.Available() && !lv.Unlimited:
		return behindDB
	}
	return wrong
}

// skuSample is a SKU's record and Redis levels, read one after the other.
type skuSample struct {
	rec arbiter.SKU
	lv  stock.Levels
}

// stoodStill waits the settle and reads the SKUs of before again, and
// returns those neither of whose stores moved meanwhile (the same seq in
// the database, the same value and epoch in Redis) and that are still
// behind.
func (c *Reconciler) stoodStill(ctx context.Context, before []skuSample) ([]string, error) {
	c.wait(ctx, c.settle)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	skus := make([]string, len(before))
	for i, b := range before {
		skus[i] = b.rec.SKU
	}
	var recs []arbiter.SKU
	if err := c.db.WithContext(ctx).Where("sku IN ?", skus).Find(&recs).Error; err != nil {
		return nil, err
	}
	now := make(map[string]arbiter.SKU, len(recs))
	for _, r := range recs {
		now[r.SKU] = r
	}
	lvs, err := c.stock.LevelsOf(ctx, skus)
	if err != nil {
		return nil, err
	}
	var out []string
	for i, b := range before {
		rec, ok := now[b.rec.SKU]
		if ok && rec.Seq == b.rec.Seq && lvs[i].Available == b.lv.Available && lvs[i].Epoch == b.lv.Epoch &&
			drift(rec, lvs[i]) == behindDB {
			out = append(out, rec.SKU)
		}
	}
	return out, nil
}
