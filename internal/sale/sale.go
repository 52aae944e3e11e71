// Package sale is the tail every kind of buy shares once Redis has
// admitted it (a cart, one SKU under its per-user limit, a campaign's
// pool, a token's hold): the group commit writes its holds, and Redis is
// put right after whatever the database decided. Written, Redis is
// settled to what the database recorded; refused, Redis is given back
// what it admitted and the refusal becomes the caller's error (realigning
// where Redis was wrong); of unknown outcome (the COMMIT went unanswered),
// the admission is kept and Redis realigned from the database, which may
// hold the units; a duplicate (a concurrent retry with the same
// Idempotency-Key or token wrote first) is answered as the first writer
// was. Each of these is handled here once, for every kind.
package sale

import (
	"context"
	"errors"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/followup"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/stock"
)

// Admitted is what Redis took for one buy, and how each outcome of its
// write puts Redis right.
type Admitted interface {
	// Settle brings Redis to what the database recorded under the
	// reservation token (followup.Redis.Settle).
	Settle(ctx context.Context, f followup.Redis, token string, fences map[string]arbiter.Fence)
	// Undo gives back what was admitted: nothing was written.
	Undo(ctx context.Context, f followup.Redis) error
	// Realign reads what the database holds instead: the write's outcome
	// is unknown.
	Realign(ctx context.Context, f followup.Redis) error
	// Refused is the caller's error for the database's refusal err.
	Refused(ctx context.Context, f followup.Redis, err error) error
	// Attrs name the admission in logs.
	Attrs() []any
}

// Pipeline writes admitted buys.
type Pipeline struct {
	Writer *groupcommit.Writer
	Redis  followup.Redis
}

// Sale is one buy Redis admitted, as the pipeline writes it.
type Sale[T any] struct {
	// Token names the buy's reservations (an order's id, a token's key).
	Token    string
	Request  *groupcommit.Request
	Admitted Admitted
	// Written is the caller's answer once the database recorded the buy.
	Written func(fences map[string]arbiter.Fence) T
	// Duplicate answers a write the database refused as a duplicate with
	// what it holds (nil: no duplicate is expected, and one is an error).
	Duplicate func(ctx context.Context) (T, error)
}

// Write writes s and puts Redis right, whatever the database decides.
func Write[T any](ctx context.Context, p Pipeline, s Sale[T]) (T, error) {
	fences, err := p.Writer.Write(ctx, s.Request)
	if err == nil {
		s.Admitted.Settle(ctx, p.Redis, s.Token, fences)
		return s.Written(fences), nil
	}
	a := s.Admitted
	p.Redis.Unwind(ctx, err,
		func(ctx context.Context) error { return a.Undo(ctx, p.Redis) },
		func(ctx context.Context) error { return a.Realign(ctx, p.Redis) }, a.Attrs()...)
	var zero T
	if arbiter.IsDuplicate(err) && s.Duplicate != nil {
		return s.Duplicate(ctx)
	}
	return zero, a.Refused(ctx, p.Redis, err)
}

// Lines is a cart's admission (stock.Store.AdmitCart), or one line's
// (stock.Store.Admit): units of each line, no buyer counted. Buyer is whom
// the database counts against a SKU's per-user limit, if any ("" none: a
// token's hold).
type Lines struct {
	Lines []inventory.Line
	Adm   []stock.Admission
	Buyer string
	// Token is the token's key in Redis that the admission remembered
	// ("" for an order's lines): undone, Redis forgets it with the units;
	// of unknown outcome too, so a retry asks the database.
	Token string
}

func (l Lines) Settle(ctx context.Context, f followup.Redis, token string, fences map[string]arbiter.Fence) {
	f.Settle(ctx, token, l.Lines, l.Adm, fences, l.Buyer, false)
}

func (l Lines) Undo(ctx context.Context, f followup.Redis) error {
	var errs []error
	for i, ln := range l.Lines {
		errs = append(errs, f.Stock.Undo(ctx, ln.SKU, ln.Qty, l.Adm[i], l.Token)) // a token forgotten with its units
	}
	return errors.Join(errs...)
}

func (l Lines) Realign(ctx context.Context, f followup.Redis) error {
	var errs []error
	if l.Token != "" {
		errs = append(errs, f.Stock.ForgetToken(ctx, l.Lines[0].SKU, l.Token))
	}
	for _, ln := range l.Lines {
		errs = append(errs, f.Stock.Realign(ctx, ln.SKU))
	}
	return errors.Join(errs...)
}

func (l Lines) Refused(ctx context.Context, f followup.Redis, err error) error {
	return f.Refused(ctx, err, false)
}

func (l Lines) Attrs() []any { return []any{"sku", l.Lines[0].SKU} }

// Buyer is a seckill's admission (stock.Store.AdmitBuyer): one SKU's
// units, counted against Buyer's per-user limit in the same script call.
type Buyer struct {
	Line  inventory.Line
	Adm   stock.Admission
	Buyer string
}

func (b Buyer) Settle(ctx context.Context, f followup.Redis, token string, fences map[string]arbiter.Fence) {
	f.Settle(ctx, token, []inventory.Line{b.Line}, []stock.Admission{b.Adm}, fences, b.Buyer, true)
}

func (b Buyer) Undo(ctx context.Context, f followup.Redis) error {
	return f.Stock.UndoBuyer(ctx, b.Line.SKU, b.Line.Qty, b.Adm, b.Buyer)
}

func (b Buyer) Realign(ctx context.Context, f followup.Redis) error {
	return f.Stock.Realign(ctx, b.Line.SKU) // the buyers' counts with it
}

func (b Buyer) Refused(ctx context.Context, f followup.Redis, err error) error {
	return f.Refused(ctx, err, true)
}

func (b Buyer) Attrs() []any { return []any{"sku", b.Line.SKU} }

// Campaign is a campaign buy's admission (stock.Store.AdmitCampaign): Qty
// units of the campaign's pool, counted against Buyer's limit in the
// campaign (nil: none).
type Campaign struct {
	Pool  stock.Campaign
	Qty   int64
	Adm   stock.Admission
	Buyer *stock.Buyer
}

func (c Campaign) Settle(ctx context.Context, f followup.Redis, token string, fences map[string]arbiter.Fence) {
	f.SettleCampaign(ctx, token, c.Pool, c.Qty, c.Adm, fences[arbiter.CampaignToken(c.Pool.ID)], c.Buyer)
}

func (c Campaign) Undo(ctx context.Context, f followup.Redis) error {
	uerr := f.Stock.UndoCampaign(ctx, c.Pool, c.Qty, c.Adm, c.Buyer)
	if uerr == nil {
		return nil
	}
	// The unit is hidden in Redis (buyers would be told sold out) until a
	// realign: this one, not the periodic one, which comes later than a
	// campaign sells out.
	f.Log.Warn("undoing a campaign admission failed; realigning", "campaign", c.Pool.ID, "err", uerr)
	return f.Stock.RealignCampaign(ctx, c.Pool)
}

func (c Campaign) Realign(ctx context.Context, f followup.Redis) error {
	return f.Stock.RealignCampaign(ctx, c.Pool)
}

func (c Campaign) Refused(ctx context.Context, f followup.Redis, err error) error {
	return f.RefusedCampaign(ctx, c.Pool, err)
}

func (c Campaign) Attrs() []any { return []any{"campaign", c.Pool.ID} }
