package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/acme/inventory"
	"github.com/acme/inventory/client"
)

// importCmd is `inventoryd import counts FILE.csv`: a warehouse's or ERP's
// count file posted to the running service in pages.
func importCmd() *cobra.Command {
	imp := &cobra.Command{Use: "import", Short: "Load data from another system into a running service"}
	var o countImport
	counts := &cobra.Command{
		Use:   "counts FILE.csv",
		Short: "Post a stock count file (sku,counted[,unshipped]) to the service, rebased to when it was counted",
		Long: `import counts posts a count file to a running inventoryd (POST /v1/stock/counts)
in pages of up to 10,000 lines, with a progress bar, and prints what was
corrected, what was short (fewer units than are held: on_hand stays at
reserved, the shortage is recorded and announced) and which SKUs the service
does not know.

FILE.csv has one line per SKU: sku,counted[,unshipped], with or without a
header line (sku,counted,unshipped). unshipped is the units paid for and not
yet shipped when the count was taken; left empty, the service computes it
from the orders it was told shipped (POST /v1/orders/{id}/ship). A location
column is refused for now. The whole file is checked before anything is
sent: a bad line (a count that is not a whole number >= 0, a SKU twice)
stops the import with nothing applied.

The count is named by --count-id (by default one derived from the file and
--counted-at, so the same import run again is the same count). Running an
import again resumes it: the pages the service applied answer as they did,
and the rest are applied. The service is $INVENTORY_URL (or --url), with the
admin token $INVENTORY_ADMIN_TOKEN or $ADMIN_TOKEN (or --token).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.file = args[0]
			return o.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := counts.Flags()
	f.StringVar(&o.countedAt, "counted-at", "", "when the units were counted, RFC 3339 (required), e.g. 2025-01-02T02:00:00Z")
	f.StringVar(&o.countID, "count-id", "", "the count's id (default: derived from the file and --counted-at)")
	f.StringVar(&o.url, "url", cmp.Or(os.Getenv("INVENTORY_URL"), "http://localhost:8080"), "the service's base URL ($INVENTORY_URL)")
	f.StringVar(&o.token, "token", "", "the admin token (default $INVENTORY_ADMIN_TOKEN, else $ADMIN_TOKEN)")
	f.IntVar(&o.page, "page", countPage, "lines per request (at most 10,000)")
	_ = counts.MarkFlagRequired("counted-at")
	imp.AddCommand(counts)
	return imp
}

// countPage is how many lines an import sends per request: the most the
// service takes.
const countPage = 10_000

// countImport is one run of import counts.
type countImport struct {
	file, countedAt, countID, url, token string
	page                                 int
}

// countRow is a line of the file.
type countRow struct {
	SKU       string `json:"sku"`
	Counted   int64  `json:"counted"`
	Unshipped *int64 `json:"unshipped,omitempty"`
}

func (o *countImport) run(ctx context.Context, stdout, stderr io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	at, err := time.Parse(time.RFC3339Nano, o.countedAt)
	if err != nil {
		return fmt.Errorf("--counted-at must be an RFC 3339 time, e.g. 2025-01-02T02:00:00Z: %w", err)
	}
	at = at.UTC().Truncate(time.Microsecond) // the service's precision
	if o.page < 1 || o.page > countPage {
		return fmt.Errorf("--page must be between 1 and %d", countPage)
	}
	o.token = cmp.Or(o.token, os.Getenv("INVENTORY_ADMIN_TOKEN"), os.Getenv("ADMIN_TOKEN"))
	if o.token == "" {
		return errors.New("no admin token: set INVENTORY_ADMIN_TOKEN (or ADMIN_TOKEN), or pass --token")
	}
	raw, err := os.ReadFile(o.file)
	if err != nil {
		return err
	}
	rows, err := readCountFile(raw)
	if err != nil {
		return fmt.Errorf("%s: %w (nothing was sent)", o.file, err)
	}
	if o.countID == "" {
		sum := sha256.Sum256(append(raw, []byte("\x00"+at.UTC().Format(time.RFC3339Nano))...))
		o.countID = "csv-" + hex.EncodeToString(sum[:8])
	}
	api, err := client.NewClientWithResponses(strings.TrimRight(o.url, "/"), client.WithRequestEditorFn(client.BearerAuth(o.token)))
	if err != nil {
		return err
	}
	before, err := o.progress(ctx, api)
	if err != nil {
		return err
	}
	if before != nil && !before.CountedAt.Equal(at) {
		return fmt.Errorf("count %s was counted at %s, not %s: pass the same --counted-at to resume it, or another --count-id", o.countID,
			before.CountedAt.UTC().Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(stderr, "count %s: %d lines counted at %s", o.countID, len(rows), at.Format(time.RFC3339Nano))
	if before != nil {
		fmt.Fprintf(stderr, ", %d of them applied before: resuming", before.Totals.Applied)
	}
	fmt.Fprintln(stderr)

	bar := newLineBar(stderr, len(rows))
	var sum countSummary
	for _, p := range countPages(len(rows), o.page, before) {
		res, err := o.post(ctx, api, at, p, rows[p.offset:p.offset+p.lines])
		if err != nil {
			bar.Finish()
			return fmt.Errorf("lines %d-%d: %w (run the import again to resume count %s)", p.offset+1, p.offset+p.lines, err, o.countID)
		}
		sum.add(res)
		bar.Add(p.lines)
	}
	bar.Finish()
	sum.print(stdout, o.countID)
	return nil
}

// readCountFile reads sku,counted[,unshipped] lines, with or without a
// header, and checks every line before anything is sent.
func readCountFile(raw []byte) ([]countRow, error) {
	r := csv.NewReader(bytes.NewReader(raw))
	r.FieldsPerRecord = -1
	r.TrimLeadingSpace = true
	r.ReuseRecord = true
	var rows []countRow
	seen := map[string]int{}
	var errs []error
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		line, _ := r.FieldPos(0)
		if len(rows) == 0 && len(errs) == 0 && strings.EqualFold(strings.TrimSpace(rec[0]), "sku") {
			if err := checkHeader(rec); err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			continue
		}
		row, err := countLine(rec)
		if err == nil {
			if prev, ok := seen[row.SKU]; ok {
				err = fmt.Errorf("%s is counted on line %d too; a count has one line per SKU", row.SKU, prev)
			}
			seen[row.SKU] = line
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", line, err))
			if len(errs) == 10 {
				errs = append(errs, errors.New("...")) //lint:ignore ST1005 the ellipsis is the list's end, after its tenth error
				break
			}
			continue
		}
		rows = append(rows, row)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(rows) == 0 {
		return nil, errors.New("no lines to count")
	}
	return rows, nil
}

// checkHeader accepts sku,counted[,unshipped]: the columns the service
// takes, in that order.
func checkHeader(rec []string) error {
	want := []string{"sku", "counted", "unshipped", "location"}
	for i, name := range rec {
		name = strings.ToLower(strings.TrimSpace(name))
		switch {
		case i >= 3 || name == "location":
			return errors.New("a location column is not supported yet: the columns are sku,counted[,unshipped]")
		case name != want[i]:
			return fmt.Errorf("the header names %q where %q goes: the columns are sku,counted[,unshipped]", name, want[i])
		}
	}
	if len(rec) < 2 {
		return errors.New("the header needs sku,counted")
	}
	return nil
}

// countLine reads one line: sku, counted (a whole number >= 0), and
// unshipped (empty, or a whole number >= 0).
func countLine(rec []string) (countRow, error) {
	for i := range rec {
		rec[i] = strings.TrimSpace(rec[i])
	}
	switch {
	case len(rec) < 2:
		return countRow{}, errors.New("a line is sku,counted[,unshipped]")
	case len(rec) > 3:
		return countRow{}, errors.New("a location column is not supported yet: a line is sku,counted[,unshipped]")
	}
	row := countRow{SKU: rec[0]}
	if err := inventory.ValidateSKU(row.SKU); err != nil {
		return row, err
	}
	n, err := strconv.ParseInt(rec[1], 10, 64)
	if err != nil || n < 0 {
		return row, fmt.Errorf("counted %q is not a whole number of units (0 or more)", rec[1])
	}
	row.Counted = n
	if len(rec) == 3 && rec[2] != "" {
		u, err := strconv.ParseInt(rec[2], 10, 64)
		if err != nil || u < 0 {
			return row, fmt.Errorf("unshipped %q is not a whole number of units (0 or more), nor empty", rec[2])
		}
		row.Unshipped = &u
	}
	return row, nil
}

// countPageSpan is one request of an import: lines offset+1..offset+lines.
type countPageSpan struct{ offset, lines int }

// countPages cuts n lines into requests of size: after the requests the
// service already has (so a resumed import sends the same lines under the
// same offsets, which it answers as replays), then size at a time.
func countPages(n, size int, before *client.CountProgress) []countPageSpan {
	var out []countPageSpan
	next := 0
	if before != nil {
		for _, p := range before.Pages {
			if int(p.Offset) != next || int(p.Offset+p.Lines) > n {
				break // not this file's paging: the service says which lines conflict
			}
			out = append(out, countPageSpan{int(p.Offset), int(p.Lines)})
			next += int(p.Lines)
		}
	}
	for ; next < n; next += size {
		out = append(out, countPageSpan{next, min(size, n-next)})
	}
	return out
}

// progress is the count as the service has it (nil: none yet).
func (o *countImport) progress(ctx context.Context, api *client.ClientWithResponses) (*client.CountProgress, error) {
	resp, err := api.GetCountWithResponse(ctx, o.countID, nil)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode() {
	case http.StatusOK:
		return resp.JSON200, nil
	case http.StatusNotFound:
		return nil, nil
	}
	return nil, answerError(resp.StatusCode(), resp.Body)
}

// post sends one page, again after a 503 (the service asks for a retry) up
// to five times: a page cut short is finished by its replay.
func (o *countImport) post(ctx context.Context, api *client.ClientWithResponses, at time.Time, p countPageSpan, rows []countRow) (*client.CountResult, error) {
	body, err := json.Marshal(map[string]any{"count_id": o.countID, "counted_at": at, "offset": p.offset, "lines": rows})
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		resp, err := api.ApplyCountWithBodyWithResponse(ctx, nil, "application/json", bytes.NewReader(body))
		switch {
		case err == nil && resp.StatusCode() == http.StatusOK:
			return resp.JSON200, nil
		case attempt == 5:
		case err != nil && ctx.Err() == nil, err == nil && resp.StatusCode() == http.StatusServiceUnavailable:
			time.Sleep(time.Duration(attempt) * time.Second)
			continue
		}
		if err != nil {
			return nil, err
		}
		return nil, answerError(resp.StatusCode(), resp.Body)
	}
}

// answerError is the service's error answer as an error.
func answerError(status int, body []byte) error {
	var e client.Error
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return fmt.Errorf("%d %s: %s", status, e.Error.Code, e.Error.Message)
	}
	return fmt.Errorf("the service answered %d: %.200s", status, body)
}

// lineBar shows lines sent: a progress bar on a terminal, a line per page
// otherwise.
type lineBar struct {
	bar         *progressbar.ProgressBar
	w           io.Writer
	done, total int
}

func newLineBar(w io.Writer, total int) *lineBar {
	b := &lineBar{w: w, total: total}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		b.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription("lines"),
			progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("lines"),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionSetRenderBlankState(true))
	}
	return b
}

func (b *lineBar) Add(n int) {
	b.done += n
	if b.bar != nil {
		_ = b.bar.Add(n)
		return
	}
	fmt.Fprintf(b.w, "%d/%d lines applied\n", b.done, b.total)
}

func (b *lineBar) Finish() {
	if b.bar != nil {
		_ = b.bar.Finish()
		fmt.Fprintln(b.w)
	}
}

// countSummary is what an import did, for the person who ran it.
type countSummary struct {
	totals     client.CountTotals
	short      []string // "SKU: n short (on_hand held at reserved)"
	unknown    []string
	superseded []string
	unlimited  []string
}

func (s *countSummary) add(r *client.CountResult) {
	t := &s.totals
	t.Applied += r.Totals.Applied
	t.Corrected += r.Totals.Corrected
	t.Unchanged += r.Totals.Unchanged
	t.Short += r.Totals.Short
	t.Unknown += r.Totals.Unknown
	t.Unlimited += r.Totals.Unlimited
	t.Superseded += r.Totals.Superseded
	t.UnitsAdded += r.Totals.UnitsAdded
	t.UnitsRemoved += r.Totals.UnitsRemoved
	t.UnitsShort += r.Totals.UnitsShort
	for _, l := range r.Lines {
		switch l.Outcome {
		case client.CountLineOutcomeShort:
			s.short = append(s.short, fmt.Sprintf("%s: %d short (counted %d, %d unshipped; on_hand held at %d)",
				l.Sku, l.Short, l.Counted, l.Unshipped, deref(l.OnHand)))
		case client.CountLineOutcomeUnknown:
			s.unknown = append(s.unknown, l.Sku)
		case client.CountLineOutcomeSuperseded:
			s.superseded = append(s.superseded, l.Sku)
		case client.CountLineOutcomeUnlimited:
			s.unlimited = append(s.unlimited, l.Sku)
		}
	}
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func (s *countSummary) print(w io.Writer, id string) {
	t := s.totals
	fmt.Fprintf(w, "count %s: %d lines applied: %d corrected, %d unchanged, %d short, %d unknown SKUs", id, t.Applied, t.Corrected, t.Unchanged, t.Short, t.Unknown)
	if t.Superseded+t.Unlimited > 0 {
		fmt.Fprintf(w, ", %d superseded by a later count or put, %d unlimited", t.Superseded, t.Unlimited)
	}
	fmt.Fprintf(w, "; on_hand +%d -%d units, %d units short\n", t.UnitsAdded, t.UnitsRemoved, t.UnitsShort)
	list := func(title string, items []string) {
		if len(items) == 0 {
			return
		}
		fmt.Fprintf(w, "%s:\n", title)
		for i, it := range items {
			if i == 20 {
				fmt.Fprintf(w, "  ... and %d more\n", len(items)-i)
				break
			}
			fmt.Fprintf(w, "  %s\n", it)
		}
	}
	list("short (recorded as anomalies and announced as sku.shortage)", s.short)
	list("unknown SKUs (nothing applied)", s.unknown)
	list("superseded (a later count or put set them; nothing applied)", s.superseded)
	list("unlimited stock (nothing applied)", s.unlimited)
}
