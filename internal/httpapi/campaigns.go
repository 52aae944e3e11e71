package httpapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/campaign"
)

// campaignParam is the campaign id in the path, decoded once and checked.
func campaignParam(c echo.Context) (string, error) {
	id, err := pathParam(c, "id")
	if err != nil {
		return "", err
	}
	return id, inventory.ValidateCampaignID(id)
}

// putCampaign creates or changes a campaign (admin; If-Match like SKUs).
func (s *Server) putCampaign(c echo.Context) error {
	id, err := campaignParam(c)
	if err != nil {
		return err
	}
	var req struct {
		SKU          *string    `json:"sku"`
		Allotment    *int64     `json:"allotment"`
		StartsAt     *time.Time `json:"starts_at"`
		EndsAt       *time.Time `json:"ends_at"`
		PerUserLimit *int64     `json:"per_user_limit"`
		HoldSeconds  *int64     `json:"hold_seconds"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	if err := required(map[string]bool{"sku": req.SKU != nil, "allotment": req.Allotment != nil,
		"starts_at": req.StartsAt != nil, "ends_at": req.EndsAt != nil}); err != nil {
		return err
	}
	spec := campaign.Spec{SKU: *req.SKU, Allotment: *req.Allotment, StartsAt: *req.StartsAt, EndsAt: *req.EndsAt}
	if req.PerUserLimit != nil {
		spec.PerUserLimit = *req.PerUserLimit
	}
	if req.HoldSeconds != nil {
		if *req.HoldSeconds <= 0 {
			return badRequest("hold_seconds must be a positive number of seconds")
		}
		spec.HoldSeconds = *req.HoldSeconds
	}
	ifMatch, err := ifMatch(c)
	if err != nil {
		return err
	}
	v, err := s.camps.Put(c.Request().Context(), id, spec, ifMatch)
	if err != nil {
		return err
	}
	return campaignAnswer(c, v)
}

// getCampaign is the product page's countdown: served from memory (at most
// campaign.Staleness old; see pollAnswer).
func (s *Server) getCampaign(c echo.Context) error {
	id, err := campaignParam(c)
	if err != nil {
		return err
	}
	v, err := s.camps.Get(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return s.pollAnswer(c, v)
}

// campaignAnswer writes v to an admin: its ETag is the campaign's version
// (If-Match on PUT).
func campaignAnswer(c echo.Context, v campaign.View) error {
	c.Response().Header().Set("ETag", `"`+v.Version+`"`)
	return c.JSON(http.StatusOK, v)
}

// countdown is a poll's answer to one view of a campaign: its ETag, and
// its body up to the value of "now" (the last member), encoded once per
// view and state however many pages poll it.
type countdown struct {
	view campaign.View // the view with Now zero
	tag  string
	head []byte
}

// pollAnswer writes v to a product page polling it. Its weak ETag names
// the state and the counts (not the clock), so a page that polls gets 304
// until something it shows changes; Cache-Control lets a page or a CDN
// keep it a second. Only "now" is written per request: the rest is the
// view's countdown, kept per campaign.
func (s *Server) pollAnswer(c echo.Context, v campaign.View) error {
	now := v.Now
	v.Now = time.Time{}
	var cd *countdown
	if got, ok := s.countdowns.Load(v.ID); ok && got.(*countdown).view == v {
		cd = got.(*countdown)
	} else {
		cd = newCountdown(v)
		s.countdowns.Store(v.ID, cd)
	}
	h := c.Response().Header()
	h["Etag"] = []string{cd.tag} // the canonical key (Header.Get reads it)
	h["Cache-Control"] = []string{"max-age=1"}
	if inm := c.Request().Header.Get("If-None-Match"); inm != "" && strings.Contains(inm, cd.tag) {
		return c.NoContent(http.StatusNotModified)
	}
	body := make([]byte, 0, len(cd.head)+len(time.RFC3339Nano)+4)
	body = append(body, cd.head...)
	body = append(body, '"')
	body = now.AppendFormat(body, time.RFC3339Nano)
	body = append(body, "\"}\n"...)
	return c.JSONBlob(http.StatusOK, body)
}

// newCountdown encodes v (Now zero) as jsonSerializer would, cut before
// the value of "now".
func newCountdown(v campaign.View) *countdown {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s|%s|%d|%d|%d|%d|%s|%s", v.Version, v.State, v.Allotment, v.Sold, v.Held, v.Remaining,
		v.StartsAt.Format(time.RFC3339Nano), v.EndsAt.Format(time.RFC3339Nano)))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err) // a view always encodes
	}
	const tail = `"0001-01-01T00:00:00Z"}` + "\n" // Now is zero and the last member
	head, ok := bytes.CutSuffix(buf.Bytes(), []byte(tail))
	if !ok {
		panic("campaign.View: now is not its last member")
	}
	return &countdown{view: v, tag: `W/"` + hex.EncodeToString(sum[:8]) + `"`, head: head}
}

// buyCampaign sells one unit of a campaign to the buyer X-Buyer-Token
// names (a body is optional; user_id in it must be that buyer).
func (s *Server) buyCampaign(c echo.Context) error {
	id, err := campaignParam(c)
	if err != nil {
		return err
	}
	var req struct {
		UserID *string `json:"user_id"`
	}
	body, err := readBody(c)
	if err != nil {
		return err
	}
	if b := bytes.TrimSpace(body); len(b) > 0 && string(b) != "{}" {
		if err := decodeJSON(body, &req); err != nil {
			return err
		}
	}
	// A campaign known to be sold out is answered from memory, before the
	// buyer token is verified (as a sold-out SKU's seckill is).
	flag := campaign.SoldOutKey(id)
	if s.soldOut.Is(flag) {
		s.cfg.Metrics.soldOutFlag.Inc()
		return c.JSONBlob(http.StatusConflict, s.soldOutBody(flag))
	}
	user, err := s.buyer(c, req.UserID)
	if err != nil {
		return err
	}
	o, err := s.camps.Buy(c.Request().Context(), id, user, c.Request().Header.Get("Idempotency-Key"))
	if early, ok := err.(campaign.NotStarted); ok {
		// Before the opening (the buyer and the key checked as for any
		// buy): an answer encoded once per opening, as cheap as a sold-out
		// flag's.
		s.cfg.Metrics.notStarted.Inc()
		a := s.earlyAnswer(id, early)
		c.Response().Header()["Retry-After"] = a.retryAfter
		return c.JSONBlob(http.StatusConflict, a.body)
	}
	s.cfg.Metrics.deduction(err, 0)
	if errors.Is(err, inventory.ErrInsufficientStock) {
		// Sold out until units come back, or the end: a buy after the end
		// is sale_ended, which the flag, checked first, would hide. The
		// view is the one Buy just read (memory).
		if v, gerr := s.camps.Get(c.Request().Context(), id); gerr == nil {
			s.soldOut.SetUntil(flag, v.EndsAt)
		} else {
			s.soldOut.Set(flag)
		}
	}
	if err != nil {
		return err
	}
	return created(c, o)
}

// retryAfter is the seconds until e's opening, rounded up, at least 1.
func retryAfter(e campaign.NotStarted) int64 {
	return max(1, int64((e.StartsAt.Sub(e.Now)+time.Second-1)/time.Second))
}

// notStarted is the error a buy before the opening is answered with.
func notStarted(e campaign.NotStarted) *apiError {
	return &apiError{status: http.StatusConflict, code: "sale_not_started", msg: e.Error(),
		header: [2]string{"Retry-After", strconv.FormatInt(retryAfter(e), 10)}}
}

// early is a campaign's answer to a buy before its opening: its body,
// exactly what the error path writes for notStarted (encoded once per
// opening: the message names starts_at), and its Retry-After (once per
// second). Never changed once stored: a new second or opening stores a new
// one.
type early struct {
	startsAt   time.Time
	body       []byte
	secs       int64
	retryAfter []string
}

// earlyAnswer is the answer to e, a buy of campaign id before its opening:
// from memory, as a sold-out flag's is, with no allocation past the first
// of each second.
func (s *Server) earlyAnswer(id string, e campaign.NotStarted) *early {
	secs := retryAfter(e)
	got, ok := s.earlyAnswers.Load(id)
	a, _ := got.(*early)
	if ok && a.startsAt.Equal(e.StartsAt) && a.secs == secs {
		return a
	}
	next := &early{startsAt: e.StartsAt, secs: secs, retryAfter: []string{strconv.FormatInt(secs, 10)}}
	if ok && a.startsAt.Equal(e.StartsAt) {
		next.body = a.body
	} else {
		next.body = s.encodedAnswer(notStarted(e))
	}
	s.earlyAnswers.Store(id, next)
	return next
}

// endCampaign ends a campaign now (admin).
func (s *Server) endCampaign(c echo.Context) error {
	id, err := campaignParam(c)
	if err != nil {
		return err
	}
	v, err := s.camps.End(c.Request().Context(), id)
	if err != nil {
		return err
	}
	s.soldOut.Clear(campaign.SoldOutKey(id)) // this node at once; the others through Redis
	return campaignAnswer(c, v)
}
