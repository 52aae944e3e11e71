// Package followup brings what the database decided into Redis once a
// write committed (or was refused): the database arbitrates, Redis then
// follows. Every follow-up runs under stock.FollowUp's context (it must not
// stop because the caller went away, nor keep the request long past its
// deadline), and a failure is logged, not returned: it leaves Redis wrong
// only in the safe direction or for the periodic realign to repair, and the
// caller's answer is the database's.
package followup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/stock"
)

// Redis is the follow-ups on one Store.
type Redis struct {
	Stock *stock.Store
	Log   *slog.Logger
}

// Apply brings changes the database committed into Redis, each exactly
// once (stock.Store.Apply's fence).
func (f Redis) Apply(ctx context.Context, chs []inventory.Change) {
	if len(chs) == 0 {
		return
	}
	ctx, cancel := stock.FollowUp(ctx)
	defer cancel()
	for _, c := range chs {
		if err := f.Stock.Apply(ctx, c); err != nil {
			f.Log.Warn("bringing a committed change into Redis failed; the realign repairs it",
				"sku", c.SKU, "delta", c.Delta, "err", err)
		}
	}
}

// Settle makes Redis count what the database recorded: an admission taken
// from a Redis value that was re-initialised before the reservation
// committed is taken again from the new value (once: see stock.Store.Apply),
// with the buyer's count if the admission counted one; units the database
// counted against buyer's per-user limit that the admission did not count
// (an order placed outside the seckill, which Redis admits without the
// limit) are counted in Redis's buyers hash unless an initialisation read
// them. In the common case (the database's epoch is the admission's, and
// the admission counted what the database counted) nothing is sent. token
// is the reservation's (an order's id, a client's token key): the batch
// the write went in moved each SKU once, at one seq, for all its
// reservations, and the token names this one's changes among them (see
// inventory.Change.Ref). adm[i] is lines[i]'s admission; fences the
// database's fence per SKU after the write; counted says whether the
// admissions counted buyer's units (AdmitBuyer).
func (f Redis) Settle(ctx context.Context, token string, lines []inventory.Line, adm []stock.Admission, fences map[string]arbiter.Fence, buyer string, counted bool) {
	var chs []inventory.Change
	for i, l := range lines {
		m := fences[l.SKU]
		byDB := buyer != "" && m.Limit > 0 // the database counted l.Qty against buyer's limit
		if byDB && !counted {
			// Fenced by the seq alone: no admission counted it. A second
			// change of this reservation at this seq: a ref of its own.
			chs = append(chs, inventory.Change{SKU: l.SKU, Seq: m.Seq, Ref: "quota:" + token, Buyers: map[string]int64{buyer: l.Qty}})
		}
		// An admission from an unlimited value took nothing, but it is settled
		// like any other: if the SKU got a limit (Put realigned Redis to a new
		// epoch) before this reservation committed, the new value did not count
		// it. While Redis is still unlimited, or in the admission's own epoch,
		// Apply changes nothing.
		if m.Epoch == adm[i].Epoch {
			continue
		}
		c := inventory.Change{SKU: l.SKU, Delta: -l.Qty, Seq: m.Seq, Epoch: adm[i].Epoch, Ref: token}
		if byDB && counted {
			c.Buyers = map[string]int64{buyer: l.Qty}
		}
		chs = append(chs, c)
	}
	f.Apply(ctx, chs)
}

// Refused turns a failed reservation write into the caller's error. When
// the database refused what Redis admitted, Redis was wrong (it lost or
// rolled back state): the SKU is realigned (its level and its buyers'
// counts) and the caller gets insufficient stock, or, refused by a buyer's
// per-user limit that Redis's pre-filter let through (admittedLimit: the
// admission checked the limit), the limit's conflict.
func (f Redis) Refused(ctx context.Context, err error, admittedLimit bool) error {
	var r arbiter.RefusedError
	var limit arbiter.OverLimitError
	switch {
	case errors.As(err, &r):
		f.realign(ctx, r.SKU, "the database refused what Redis admitted; realigning")
		return fmt.Errorf("%w: %s", inventory.ErrInsufficientStock, r.SKU)
	case errors.As(err, &limit):
		if admittedLimit {
			f.realign(ctx, limit.SKU, "the database refused a buyer Redis's per-user count admitted; realigning")
		}
		return err
	case errors.Is(err, inventory.ErrUnknownSKU):
		return err
	}
	return fmt.Errorf("order: write: %w", err)
}

// Unwind puts Redis right after the write of an admission failed with
// err, under FollowUp's context. When nothing was written, undo gives the
// admission back. When the write's outcome is unknown
// (groupcommit.ErrUnknownOutcome: its COMMIT was sent and not answered),
// the rows may exist and hold the units: given back, the units would be
// counted twice in Redis, once by the database's reservation and once as
// available, until the periodic realign. So the admission is kept (at
// worst it hides units the database never reserved) and realign reads
// what the database holds instead: under the row lock, which a commit
// still in flight holds until it ends, so the read sees its outcome.
// Failures are logged with attrs: Redis is then wrong in the safe
// direction or until the periodic realign.
func (f Redis) Unwind(ctx context.Context, err error, undo, realign func(context.Context) error, attrs ...any) {
	fctx, cancel := stock.FollowUp(ctx)
	defer cancel()
	if errors.Is(err, groupcommit.ErrUnknownOutcome) {
		if rerr := realign(fctx); rerr != nil {
			f.Log.Warn("realigning after a write of unknown outcome failed; the periodic realign repairs it",
				append(attrs, "err", rerr)...)
		}
		return
	}
	if uerr := undo(fctx); uerr != nil {
		f.Log.Warn("undoing an admission failed; the realign repairs it", append(attrs, "err", uerr)...)
	}
}

func (f Redis) realign(ctx context.Context, sku, why string) {
	f.Log.Warn(why, "sku", sku)
	fctx, cancel := stock.FollowUp(ctx)
	defer cancel()
	if rerr := f.Stock.Realign(fctx, sku); rerr != nil {
		f.Log.Warn("realign failed; the periodic realign retries", "sku", sku, "err", rerr)
	}
}

// SettleCampaign is Settle for the reservation token's admission of qty
// from campaign c's pool, which counted qty against b's limit (b nil:
// none): fence is the pool's fence the database returned (the batch's
// sales of c share its seq; token names this one's).
func (f Redis) SettleCampaign(ctx context.Context, token string, c stock.Campaign, qty int64, adm stock.Admission, fence arbiter.Fence, b *stock.Buyer) {
	if fence.Epoch == adm.Epoch {
		return
	}
	ctx, cancel := stock.FollowUp(ctx)
	defer cancel()
	ch := inventory.Change{SKU: c.SKU, Delta: -qty, Seq: fence.Seq, Epoch: adm.Epoch, Ref: token}
	if b != nil {
		ch.Buyers = map[string]int64{b.User: qty}
	}
	if err := f.Stock.ApplyCampaign(ctx, c, ch); err != nil {
		f.Log.Warn("bringing a campaign sale into Redis failed; the realign repairs it", "campaign", c.ID, "err", err)
	}
}

// RefusedCampaign is Refused for a campaign sale: the database's reason
// (not started, ended, sold out) is the caller's answer, and when Redis had
// admitted a sale the pool could not cover, the pool is realigned.
func (f Redis) RefusedCampaign(ctx context.Context, c stock.Campaign, err error) error {
	var r arbiter.CampaignRefusedError
	if !errors.As(err, &r) {
		var limit arbiter.OverLimitError
		if errors.As(err, &limit) {
			return fmt.Errorf("%w: buyer %s reached the limit of %d in campaign %s", inventory.ErrConflict, limit.User, limit.Limit, c.ID)
		}
		return fmt.Errorf("order: write: %w", err)
	}
	if errors.Is(r.Err, inventory.ErrInsufficientStock) {
		f.Log.Warn("the database refused what Redis admitted from a campaign; realigning", "campaign", c.ID)
		fctx, cancel := stock.FollowUp(ctx)
		defer cancel()
		if rerr := f.Stock.RealignCampaign(fctx, c); rerr != nil {
			f.Log.Warn("realign failed; the periodic realign retries", "campaign", c.ID, "err", rerr)
		}
	}
	return r.Err
}

// ApplyCampaigns brings units a release gave back to live campaigns' pools
// into Redis, with the campaign limits' counts given back with them: a
// release frees one sale per campaign (a campaign order has one line), so
// a campaign's counts ride on its pool's change, under the seq that fences
// both (on the first, should there be more: one transaction made them all,
// and an initialisation read all of it or none). Counts given back by sales whose campaign had ended (their units
// went to the SKU) have nothing in Redis to go back to: an ended campaign
// has no keys.
func (f Redis) ApplyCampaigns(ctx context.Context, chs []arbiter.CampaignChange, quotas []arbiter.CampaignUnits) {
	if len(chs) == 0 {
		return
	}
	ctx, cancel := stock.FollowUp(ctx)
	defer cancel()
	counted := map[string]bool{} // the campaigns whose counts rode on a change
	for _, c := range chs {
		ch := inventory.Change{SKU: c.SKU, Delta: c.Delta, Seq: c.Seq}
		for _, q := range quotas {
			if q.ID == c.ID && !counted[c.ID] {
				if ch.Buyers == nil {
					ch.Buyers = map[string]int64{}
				}
				ch.Buyers[q.User] -= q.Qty
			}
		}
		counted[c.ID] = true
		if err := f.Stock.ApplyCampaign(ctx, stock.Campaign{ID: c.ID, SKU: c.SKU}, ch); err != nil {
			f.Log.Warn("bringing a campaign's units back into Redis failed; the realign repairs it", "campaign", c.ID, "err", err)
		}
	}
}

// Ended deletes the Redis keys of campaigns that ended (their pools
// released): nothing needs them any more. A failure is logged: the realign
// job deletes the keys of recently ended campaigns again, and they expire
// a while after the window's close anyway.
func (f Redis) Ended(ctx context.Context, ended []arbiter.CampaignRef) {
	if len(ended) == 0 {
		return
	}
	ctx, cancel := stock.FollowUp(ctx)
	defer cancel()
	cs := make([]stock.Campaign, len(ended))
	for i, e := range ended {
		cs[i] = stock.Campaign{ID: e.ID, SKU: e.SKU}
	}
	if err := f.Stock.DropCampaigns(ctx, cs...); err != nil {
		f.Log.Warn("deleting ended campaigns' keys failed; the realign job deletes them", "campaigns", len(cs), "err", err)
	}
}
