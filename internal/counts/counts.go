// Package counts applies stock counts (POST /v1/stock/counts): what a
// warehouse or an ERP counted at counted_at, line by line, rebased by the
// arbiter to a correction now (internal/arbiter counts.go), in batches of
// one transaction each, then brought into Redis through the fenced apply.
// A count may come in several requests (pages, by offset); a request
// replayed changes nothing and is answered as the first time, from the
// lines' own records; another body under the same count_id and lines is a
// conflict.
package counts

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/stock"
)

// MaxLines bounds the lines of one request: a larger count is several
// requests under one count_id, each with its offset.
const MaxLines = 10_000

// DefaultParallel is how many batches of a request are applied at once.
const DefaultParallel = 3

// Config tunes the counts.
type Config struct {
	// Retention is the movements' retention (INVENTORY_RETENTION): a
	// count may be rebased up to arbiter.CountHorizon(Retention) back.
	// Default 30 days.
	Retention time.Duration
	// Parallel is how many of a request's batches are applied at once.
	// Default DefaultParallel.
	Parallel int
	Now      func() time.Time
	Logger   *slog.Logger
}

// Service applies counts and reads their progress.
type Service struct {
	db    *gorm.DB
	stock *stock.Store
	cfg   Config
}

func New(db *gorm.DB, st *stock.Store, cfg Config) *Service {
	if cfg.Retention <= 0 {
		cfg.Retention = 30 * 24 * time.Hour
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = DefaultParallel
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{db: db, stock: st, cfg: cfg}
}

// Horizon is how far back a count's counted_at may be.
func (s *Service) Horizon() time.Duration { return arbiter.CountHorizon(s.cfg.Retention) }

// Line is one line of a request: a SKU, the units counted, and the units
// paid for and not shipped at counted_at (nil: computed from the orders'
// shipped signal).
type Line struct {
	SKU       string
	Counted   int64
	Unshipped *int64
}

// Request is one request of a count: its lines are the count's lines
// Offset+1 .. Offset+len(Lines).
type Request struct {
	CountID   string
	CountedAt time.Time
	Offset    int64
	Lines     []Line
}

// LineResult is one line's outcome, as the request's answer gives it.
type LineResult struct {
	Line      int64  `json:"line"`
	SKU       string `json:"sku"`
	Outcome   string `json:"outcome"`
	Counted   int64  `json:"counted"`
	Unshipped int64  `json:"unshipped"`
	// UnshippedFrom says where unshipped came from: "line" (the line said
	// it) or "shipped" (computed from the orders' shipped signal).
	UnshippedFrom string `json:"unshipped_from"`
	OnHandThen    *int64 `json:"on_hand_then,omitempty"`
	Correction    int64  `json:"correction"`
	Applied       int64  `json:"applied"`
	Short         int64  `json:"short"`
	OnHand        *int64 `json:"on_hand,omitempty"`
	// Status and Error say why nothing was applied (404 unknown SKU, 409
	// unlimited stock or a later count); absent when the line applied.
	Status int        `json:"status,omitempty"`
	Error  *LineError `json:"error,omitempty"`
}

// LineError is a line's error, in the API's error shape.
type LineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Totals sums lines by outcome, and the units they moved.
type Totals struct {
	Applied      int64 `json:"applied"` // lines done, whatever their outcome
	Corrected    int64 `json:"corrected"`
	Unchanged    int64 `json:"unchanged"`
	Short        int64 `json:"short"`
	Unknown      int64 `json:"unknown"`
	Unlimited    int64 `json:"unlimited"`
	Superseded   int64 `json:"superseded"`
	UnitsAdded   int64 `json:"units_added"`
	UnitsRemoved int64 `json:"units_removed"`
	UnitsShort   int64 `json:"units_short"`
}

// Result answers a request: the totals of its lines by outcome, and the
// lines that changed a SKU or were not applied (every outcome but
// unchanged): a count mostly confirms the stock, and a line that found
// what the stock says is a number in the totals, not 200 bytes of answer
// (nor of the batch's record, which answers a replay).
type Result struct {
	CountID   string       `json:"count_id"`
	CountedAt time.Time    `json:"counted_at"`
	Offset    int64        `json:"offset"`
	Totals    Totals       `json:"totals"`
	Lines     []LineResult `json:"lines"`
}

// Validate checks a request before anything is written: the count's id,
// counted_at, the offset, 1 to MaxLines lines, each with a valid SKU
// (once per request), counted and unshipped between 0 and the stock bound.
// The first problem is the error, naming the line.
func Validate(r Request) error {
	if err := validateID(r.CountID); err != nil {
		return err
	}
	if r.CountedAt.IsZero() {
		return inventory.Invalidf("counted_at is required (RFC 3339, when the units were counted)")
	}
	if r.Offset < 0 || r.Offset > 1<<31-1-MaxLines {
		return inventory.Invalidf("offset must be between 0 and %d", 1<<31-1-MaxLines)
	}
	if len(r.Lines) == 0 || len(r.Lines) > MaxLines {
		return inventory.Invalidf("a count request has 1 to %d lines, got %d (send a larger count as several requests of the same count_id, each with its offset)", MaxLines, len(r.Lines))
	}
	seen := make(map[string]int, len(r.Lines))
	for i, l := range r.Lines {
		n := r.Offset + int64(i) + 1
		if err := inventory.ValidateSKU(l.SKU); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		if prev, ok := seen[l.SKU]; ok {
			return inventory.Invalidf("line %d: %s is counted on line %d too; a count has one line per SKU", n, l.SKU, prev)
		}
		seen[l.SKU] = int(n)
		if l.Counted < 0 || l.Counted > arbiter.MaxStock {
			return inventory.Invalidf("line %d: counted must be between 0 and %d, got %d", n, int64(arbiter.MaxStock), l.Counted)
		}
		if l.Unshipped != nil && (*l.Unshipped < 0 || *l.Unshipped > arbiter.MaxStock) {
			return inventory.Invalidf("line %d: unshipped must be between 0 and %d, got %d", n, int64(arbiter.MaxStock), *l.Unshipped)
		}
	}
	return nil
}

// validateID checks a count id: 1-64 characters of A-Z a-z 0-9 . _ : -,
// starting with a letter or digit (as order ids).
func validateID(v string) error {
	ok := len(v) >= 1 && len(v) <= 64
	for i := 0; ok && i < len(v); i++ {
		b := v[i]
		ok = 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || i > 0 && (b == '.' || b == '_' || b == ':' || b == '-')
	}
	if !ok {
		return inventory.Invalidf("count_id must be 1-64 characters of A-Z a-z 0-9 . _ : -, starting with a letter or digit")
	}
	return nil
}

// ValidateID checks a count id as Apply does (the progress route's).
func ValidateID(v string) error { return validateID(v) }

// Apply applies a request's lines not applied yet, and answers every line
// of the request as applied (now, or by an earlier or concurrent run of
// the same request). It refuses, changing nothing, a request that is
// invalid, whose counted_at is before the horizon or after now, or that
// conflicts with what the count's earlier requests said.
func (s *Service) Apply(ctx context.Context, r Request) (*Result, error) {
	if err := Validate(r); err != nil {
		return nil, err
	}
	at := r.CountedAt.UTC().Truncate(time.Microsecond)
	r.CountedAt = at
	tooOld := s.checkTime(at)
	complete, err := s.claim(ctx, r, tooOld)
	if err != nil {
		return nil, err
	}
	var applied map[int64]*arbiter.CountOutcome
	if !complete {
		if tooOld != nil {
			return nil, tooOld // a page begun, then left until past the horizon
		}
		if applied, err = s.applyLines(ctx, r); err != nil {
			return nil, err
		}
	}
	res, err := s.answer(ctx, r, applied)
	if err == nil && !complete {
		s.cfg.Logger.Info("stock count applied", "count_id", r.CountID, "offset", r.Offset, "lines", len(r.Lines),
			"corrected", res.Totals.Corrected, "short", res.Totals.Short, "unknown", res.Totals.Unknown)
	}
	return res, err
}

// checkTime says why a count at at cannot be rebased now, if it cannot.
func (s *Service) checkTime(at time.Time) error {
	now := s.cfg.Now().UTC()
	if at.After(now) {
		return inventory.Invalidf("counted_at %s is after the service's clock (%s): a count says what was counted, so it cannot be later than now",
			at.Format(time.RFC3339Nano), now.Format(time.RFC3339))
	}
	h := s.Horizon()
	if earliest := now.Add(-h); at.Before(earliest) {
		return inventory.Invalidf("counted_at %s is older than the counts' horizon: a count is rebased through the stock movements retention keeps, so counted_at may be at most %s back (INVENTORY_RETENTION less an hour), at or after %s",
			at.Format(time.RFC3339Nano), h, earliest.Format(time.RFC3339))
	}
	return nil
}

// page is a request of a count as recorded.
type page struct {
	CountID   string `gorm:"primaryKey;column:count_id"`
	FirstLine int64  `gorm:"primaryKey;column:first_line"`
	LineCount int64  `gorm:"column:line_count"`
	BodyHash  string `gorm:"column:body_hash"`
	CreatedAt time.Time
}

func (page) TableName() string { return "stock_count_pages" }

// header is a count as recorded.
type header struct {
	CountID   string    `gorm:"primaryKey;column:count_id"`
	CountedAt time.Time `gorm:"column:counted_at"`
	CreatedAt time.Time `gorm:"column:created_at"`
}

func (header) TableName() string { return "stock_counts" }

// claim records the count (first request) and the request's page, under
// the count's row lock, or finds them recorded: a replay (the same lines)
// goes on; another counted_at, other lines at the same offset or lines
// overlapping another request's are conflicts. A new count is not
// recorded when tooOld says it cannot be rebased. It reports whether every
// line of the page is applied already.
func (s *Service) claim(ctx context.Context, r Request, tooOld error) (complete bool, err error) {
	hash := bodyHash(r)
	n := int64(len(r.Lines))
	err = arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
		complete = false
		var h []header
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("count_id = ?", r.CountID).Find(&h).Error; err != nil {
			return err
		}
		if len(h) == 0 {
			if tooOld != nil {
				return tooOld
			}
			err := tx.Create(&header{CountID: r.CountID, CountedAt: r.CountedAt, CreatedAt: s.cfg.Now().UTC()}).Error
			if arbiter.IsDuplicate(err) { // another request of the count created it first: run again, and find it
				return arbiter.InsertRaced(err)
			}
			if err != nil {
				return err
			}
			h = append(h, header{CountedAt: r.CountedAt})
		}
		if !h[0].CountedAt.Equal(r.CountedAt) {
			return fmt.Errorf("%w: count %s was counted at %s; this request says %s", inventory.ErrConflict, r.CountID,
				h[0].CountedAt.UTC().Format(time.RFC3339Nano), r.CountedAt.Format(time.RFC3339Nano))
		}
		var pages []page
		if err := tx.Where("count_id = ?", r.CountID).Order("first_line").Find(&pages).Error; err != nil {
			return err
		}
		for _, p := range pages {
			switch {
			case p.FirstLine == r.Offset && p.LineCount == n && p.BodyHash == hash:
				done, err := linesDone(tx, r.CountID, r.Offset+1, r.Offset+n)
				complete = done == n
				return err
			case p.FirstLine == r.Offset:
				return fmt.Errorf("%w: lines %d-%d of count %s were sent before with other lines; a count's lines are sent once (a replay must be the same request)",
					inventory.ErrConflict, p.FirstLine+1, p.FirstLine+p.LineCount, r.CountID)
			case p.FirstLine < r.Offset+n && r.Offset < p.FirstLine+p.LineCount:
				return fmt.Errorf("%w: lines %d-%d overlap lines %d-%d of count %s, sent before",
					inventory.ErrConflict, r.Offset+1, r.Offset+n, p.FirstLine+1, p.FirstLine+p.LineCount, r.CountID)
			}
		}
		if tooOld != nil {
			return tooOld
		}
		return tx.Create(&page{CountID: r.CountID, FirstLine: r.Offset, LineCount: n, BodyHash: hash, CreatedAt: s.cfg.Now().UTC()}).Error
	})
	return complete, err
}

// linesDone counts the applied lines of count id numbered first..last
// (the batches that start there: a request's batches never cross it).
func linesDone(db *gorm.DB, id string, first, last int64) (int64, error) {
	var n int64
	err := db.Raw(`SELECT COALESCE(SUM(line_count), 0) FROM stock_count_batches WHERE count_id = ? AND first_line BETWEEN ? AND ?`,
		id, first, last).Scan(&n).Error
	return n, err
}

// bodyHash names what a request says: counted_at, the offset, and every
// line (SKU, counted, unshipped or its absence), so a replay matches and
// anything else under the same lines does not.
func bodyHash(r Request) string {
	h := sha256.New()
	var b [8]byte
	put := func(v int64) {
		binary.BigEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	put(r.CountedAt.UnixMicro())
	put(r.Offset)
	for _, l := range r.Lines {
		put(int64(len(l.SKU)))
		h.Write([]byte(l.SKU))
		put(l.Counted)
		if l.Unshipped == nil {
			put(-1)
		} else {
			put(*l.Unshipped)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// applyLines applies the request's lines in batches of
// arbiter.CountBatchLines, up to cfg.Parallel at once: for each, what can
// be read without a lock (arbiter.ReadRebase), then one transaction
// (ApplyCount), then Redis follows. The batches of one request name
// distinct SKUs, so they never wait for each other's row locks; a batch's
// transaction waits most of its time on the database (round trips, the
// commit's flush), which another batch fills. A batch applied before (a
// replay resuming) costs one read.
//
// It returns the outcomes of the batches it applied, by their first line
// (those an earlier or concurrent run applied are read for the answer).
func (s *Service) applyLines(ctx context.Context, r Request) (map[int64]*arbiter.CountOutcome, error) {
	var mu sync.Mutex
	out := map[int64]*arbiter.CountOutcome{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.cfg.Parallel)
	for start := 0; start < len(r.Lines); start += arbiter.CountBatchLines {
		part := r.Lines[start:min(len(r.Lines), start+arbiter.CountBatchLines)]
		first := r.Offset + int64(start) + 1
		g.Go(func() error {
			outcome, err := s.applyBatch(gctx, r, part, first)
			if outcome != nil {
				mu.Lock()
				out[first] = outcome
				mu.Unlock()
			}
			return err
		})
	}
	return out, g.Wait()
}

// applyBatch applies part, the request's lines numbered from first, and
// returns its outcome (nil: applied before).
func (s *Service) applyBatch(ctx context.Context, r Request, part []Line, first int64) (*arbiter.CountOutcome, error) {
	done, err := linesDone(s.db.WithContext(ctx), r.CountID, first, first)
	if err != nil || done > 0 {
		return nil, err
	}
	b := arbiter.CountBatch{CountID: r.CountID, CountedAt: r.CountedAt, FirstLine: first, Lines: make([]arbiter.CountLine, len(part))}
	skus := make([]string, len(part))
	for i, l := range part {
		b.Lines[i] = arbiter.CountLine{Line: first + int64(i), SKU: l.SKU, Counted: l.Counted, Unshipped: l.Unshipped}
		skus[i] = l.SKU
	}
	if b.Rebase, err = arbiter.ReadRebase(s.db.WithContext(ctx), skus, r.CountedAt); err != nil {
		return nil, err
	}
	var applied arbiter.CountApplied
	if err := arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
		var err error
		applied, err = arbiter.In(tx).ApplyCount(b)
		return err
	}); err != nil {
		return nil, err
	}
	s.follow(ctx, applied.Changes)
	return applied.Outcome, nil
}

// follow brings a batch's committed changes into Redis (fenced: each
// once). A failure is logged: the database has the count, and the periodic
// realign brings Redis to it.
func (s *Service) follow(ctx context.Context, chs []inventory.Change) {
	if len(chs) == 0 || s.stock == nil {
		return
	}
	fctx, cancel := stock.FollowUp(ctx)
	defer cancel()
	if err := s.stock.ApplyMany(fctx, chs); err != nil {
		s.cfg.Logger.Warn("a count's corrections did not all reach Redis; the periodic realign repairs them", "err", err)
	}
}

// answer is the request's lines as applied: those this run applied
// (applied, by their batch's first line), and the others' records.
func (s *Service) answer(ctx context.Context, r Request, applied map[int64]*arbiter.CountOutcome) (*Result, error) {
	batches := make([]*arbiter.CountOutcome, 0, (len(r.Lines)+arbiter.CountBatchLines-1)/arbiter.CountBatchLines)
	for start := 0; start < len(r.Lines); start += arbiter.CountBatchLines {
		batches = append(batches, applied[r.Offset+int64(start)+1])
	}
	if slices.Contains(batches, nil) { // applied before: their records
		var recs []arbiter.CountBatchRecord
		if err := s.db.WithContext(ctx).Where("count_id = ? AND first_line BETWEEN ? AND ?", r.CountID, r.Offset+1, r.Offset+int64(len(r.Lines))).
			Find(&recs).Error; err != nil {
			return nil, err
		}
		for _, rec := range recs {
			i := int(rec.FirstLine-r.Offset-1) / arbiter.CountBatchLines
			if i < 0 || i >= len(batches) || batches[i] != nil {
				continue
			}
			var err error
			if batches[i], err = rec.Decode(); err != nil {
				return nil, err
			}
		}
	}
	res := &Result{CountID: r.CountID, CountedAt: r.CountedAt, Offset: r.Offset, Lines: []LineResult{}}
	for _, b := range batches {
		if b == nil {
			return nil, fmt.Errorf("counts: a batch of count %s from line %d is not applied", r.CountID, r.Offset+1)
		}
		for _, l := range b.Lines {
			res.Lines = append(res.Lines, lineResult(l))
		}
		res.Totals.add(b.CountTotals, b.LineCount)
	}
	if res.Totals.Applied != int64(len(r.Lines)) {
		return nil, fmt.Errorf("counts: %d of the %d lines of count %s from %d are applied", res.Totals.Applied, len(r.Lines), r.CountID, r.Offset+1)
	}
	return res, nil
}

// lineResult is a line's answer from its record.
func lineResult(row arbiter.CountedLine) LineResult {
	l := LineResult{Line: row.Line, SKU: row.SKU, Outcome: row.Outcome, Counted: row.Counted, Unshipped: row.Unshipped,
		UnshippedFrom: "shipped", OnHandThen: row.OnHandThen, Correction: row.Correction, Applied: row.Applied,
		Short: row.Short, OnHand: row.OnHand}
	if row.UnshippedGiven {
		l.UnshippedFrom = "line"
	}
	switch row.Outcome {
	case arbiter.CountUnknown:
		l.Status, l.Error = 404, &LineError{"not_found", "unknown sku: " + row.SKU + " (nothing applied)"}
	case arbiter.CountUnlimited:
		l.Status, l.Error = 409, &LineError{"conflict", row.SKU + " has unlimited stock; set a stock first (nothing applied)"}
	case arbiter.CountSuperseded:
		l.Status, l.Error = 409, &LineError{"conflict", row.SKU + " was counted or put at or after this counted_at; this count would undo or repeat that (nothing applied)"}
	}
	return l
}

func (t *Totals) add(u arbiter.CountTotals, lines int64) {
	t.Applied += lines
	t.Corrected += u.Corrected
	t.Unchanged += u.Unchanged
	t.Short += u.Short
	t.Unknown += u.Unknown
	t.Unlimited += u.Unlimited
	t.Superseded += u.Superseded
	t.UnitsAdded += u.UnitsAdded
	t.UnitsRemoved += u.UnitsRemoved
	t.UnitsShort += u.UnitsShort
}

// Page is one request of a count, as progress shows it.
type Page struct {
	Offset  int64 `json:"offset"`
	Lines   int64 `json:"lines"`
	Applied int64 `json:"applied"`
}

// Progress is a count as far as it is applied.
type Progress struct {
	CountID   string    `json:"count_id"`
	CountedAt time.Time `json:"counted_at"`
	CreatedAt time.Time `json:"created_at"`
	// Lines is how many lines the count's requests carried so far;
	// Totals.Applied how many of them are applied.
	Lines  int64  `json:"lines"`
	Done   bool   `json:"done"`
	Totals Totals `json:"totals"`
	Pages  []Page `json:"pages"`
}

// Get reads count id's progress: its requests, and its lines by outcome as
// far as they are applied (each batch commits on its own, so a count being
// applied shows how far it is).
func (s *Service) Get(ctx context.Context, id string) (*Progress, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	db := s.db.WithContext(ctx)
	var h []header
	if err := db.Where("count_id = ?", id).Find(&h).Error; err != nil {
		return nil, err
	}
	if len(h) == 0 {
		return nil, fmt.Errorf("%w: no count %s", inventory.ErrNotFound, id)
	}
	p := &Progress{CountID: id, CountedAt: h[0].CountedAt.UTC(), CreatedAt: h[0].CreatedAt.UTC(), Pages: []Page{}}
	var pages []page
	if err := db.Where("count_id = ?", id).Order("first_line").Find(&pages).Error; err != nil {
		return nil, err
	}
	for _, pg := range pages {
		done, err := linesDone(db, id, pg.FirstLine+1, pg.FirstLine+pg.LineCount)
		if err != nil {
			return nil, err
		}
		p.Pages = append(p.Pages, Page{Offset: pg.FirstLine, Lines: pg.LineCount, Applied: done})
		p.Lines += pg.LineCount
	}
	var recs []arbiter.CountBatchRecord
	if err := db.Omit("outcomes").Where("count_id = ?", id).Find(&recs).Error; err != nil {
		return nil, err
	}
	for _, rec := range recs {
		p.Totals.add(rec.CountTotals, rec.LineCount)
	}
	p.Done = p.Totals.Applied == p.Lines
	return p, nil
}
