// Package httpapi serves the inventory API (docs/SPEC.md section 5) on Echo.
package httpapi

import (
	"bytes"
	"context"
	"crypto/hmac"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/internal/catalog"
	"github.com/acme/inventory/internal/counts"
	"github.com/acme/inventory/internal/identity"
	"github.com/acme/inventory/internal/listing"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/internal/webhooks"
	"github.com/acme/inventory/order"
)

//go:embed openapi.yaml
var openAPI []byte

// Config is what the HTTP layer needs besides the domain services.
type Config struct {
	AdminToken string
	// ClientTokens are the client credentials accepted on client routes
	// (several, so one can be rotated without downtime).
	ClientTokens []string
	// Buyers verifies X-Buyer-Token, the buyer identity behind orders and
	// seckill purchases. Required.
	Buyers        *identity.Verifier
	PaymentSecret string
	// TrustedProxies are the proxies whose X-Forwarded-For is believed; with
	// none, the connection's remote address is the client.
	TrustedProxies []*net.IPNet
	// RateLimitClients bounds how many client addresses the seckill rate
	// limit remembers (least recently seen dropped first). Default 100000.
	RateLimitClients int
	// ReplayWindow bounds how far a callback's X-Timestamp may be from now. Default 5m.
	ReplayWindow time.Duration
	// SeckillRate is each client's (IP's) rate on the seckill route, per
	// second, with a burst of twice that. Default 50.
	SeckillRate float64
	// RequestTimeout is every request's deadline: the context of every
	// Redis command, SQL statement and group commit a request makes ends
	// then, and a dependency that has not answered by then gets the
	// request a 503. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Ready reports each dependency the API needs for /readyz: any error
	// makes the node unready (503).
	Ready func(ctx context.Context) map[string]error
	// Degraded reports what this node can lose and still serve the API (the
	// sync to the broker): an error shows as "degraded: ..." in /readyz, which
	// stays 200, so a broker outage slows the sync instead of taking every
	// node out of the load balancer.
	Degraded func(ctx context.Context) map[string]error
	Gatherer prometheus.Gatherer
	Metrics  *Metrics
	Now      func() time.Time
	Logger   *slog.Logger
}

// Server is the HTTP API.
type Server struct {
	cfg      Config
	orders   *order.Service
	catalog  *catalog.Catalog
	camps    *campaign.Service
	tokens   *tokens.Service
	listing  *listing.Reader
	webhooks *webhooks.Service
	counts   *counts.Service
	onPut    func()
	soldOut  *SoldOut
	// soldOutBodies holds, per SKU, the encoded answer to a purchase the
	// sold-out flag refuses: the cheapest answer the service gives, so it is
	// written as bytes, not rebuilt per request.
	soldOutBodies sync.Map // sku -> []byte
	// earlyAnswers holds, per campaign, the answer to a buy before its
	// opening (see earlyAnswer).
	earlyAnswers sync.Map // campaign id -> *early
	countdowns   sync.Map // campaign id -> *countdown (see pollAnswer)
	log          *slog.Logger
	e            *echo.Echo
}

// Services are the domain services the routes call.
type Services struct {
	Orders    *order.Service
	Catalog   *catalog.Catalog
	Tokens    *tokens.Service
	Listing   *listing.Reader
	Campaigns *campaign.Service
	// Webhooks are the stock events' subscriptions.
	Webhooks *webhooks.Service
	// Counts applies stock counts.
	Counts *counts.Service
	// OnWebhookPut is told a subscription was put or resumed (the
	// delivery looks at it now); nil: nothing.
	OnWebhookPut func()
}

func New(cfg Config, svc Services, soldOut *SoldOut) *Server {
	if cfg.ReplayWindow == 0 {
		cfg.ReplayWindow = 5 * time.Minute
	}
	if cfg.SeckillRate == 0 {
		cfg.SeckillRate = 50
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.RateLimitClients == 0 {
		cfg.RateLimitClients = 100_000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Ready == nil {
		cfg.Ready = func(context.Context) map[string]error { return nil }
	}
	if cfg.Degraded == nil {
		cfg.Degraded = func(context.Context) map[string]error { return nil }
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	s := &Server{cfg: cfg, orders: svc.Orders, catalog: svc.Catalog, tokens: svc.Tokens, listing: svc.Listing, camps: svc.Campaigns, webhooks: svc.Webhooks, counts: svc.Counts, onPut: svc.OnWebhookPut, soldOut: soldOut, log: cfg.Logger}
	if s.onPut == nil {
		s.onPut = func() {}
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	e.JSONSerializer = jsonSerializer{}
	e.IPExtractor = ipExtractor(cfg.TrustedProxies)
	e.Pre(routeOnEscapedPath)
	e.Use(requestID, middleware.Recover(), cfg.Metrics.observe(func(err error) int { status, _ := s.answer(err); return status }),
		deadline(cfg.RequestTimeout))
	e.Use(middleware.BodyLimitWithConfig(middleware.BodyLimitConfig{Limit: strconv.Itoa(maxBody), Skipper: skipBodyLimit}))

	e.GET("/healthz", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]string{"status": "ok"}) })
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{})))
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", openAPI) })

	v1 := e.Group("/v1")
	admin, client := s.requireAdmin, s.requireClient
	v1.PUT("/skus/:sku", s.putSKU, admin)
	v1.POST("/skus/:sku/adjust", s.adjustSKU, admin)
	v1.GET("/skus/:sku", s.getSKU, client)
	v1.POST("/stock/deduct", s.deduct, client)
	v1.POST("/stock/commit", s.commit, client)
	v1.POST("/stock/release", s.release, client)
	v1.POST("/stock/extend", s.extendHold, client)
	v1.POST("/orders", s.createOrder, client)
	v1.GET("/orders/:id", s.getOrder, client)
	v1.POST("/orders/:id/cancel", s.cancelOrder, client)
	v1.POST("/orders/:id/extend", s.extendOrder, client)
	v1.POST("/orders/:id/refund", s.refundOrder, admin)
	v1.POST("/payments/callback", s.paymentCallback)
	s.listingRoutes(v1, client, admin)
	limits := newLimiterStore(cfg.SeckillRate, cfg.RateLimitClients)
	limiter := middleware.RateLimiterWithConfig(middleware.RateLimiterConfig{
		Store:               limits,
		IdentifierExtractor: func(c echo.Context) (string, error) { return c.RealIP(), nil },
		DenyHandler:         func(echo.Context, string, error) error { return rateLimited(limits.retryAfter()) },
		ErrorHandler:        func(echo.Context, error) error { return rateLimited(limits.retryAfter()) },
	})
	v1.POST("/seckill/:sku/buy", s.seckill, client, limiter)
	v1.PUT("/campaigns/:id", s.putCampaign, admin)
	v1.GET("/campaigns/:id", s.getCampaign, client)
	v1.POST("/campaigns/:id/buy", s.buyCampaign, client, limiter)
	v1.POST("/campaigns/:id/end", s.endCampaign, admin)
	s.webhookRoutes(v1, admin)
	s.countRoutes(v1, admin, client)
	s.e = e
	return s
}

// DefaultRequestTimeout is a request's deadline when the configuration does
// not say (INVENTORY_REQUEST_TIMEOUT): a checkout that has not heard back in
// a second is better told 503 than kept waiting.
const DefaultRequestTimeout = time.Second

// soldOutBody is the answer to a purchase of a sold-out SKU: exactly what
// the error path writes for it, encoded once per SKU.
func (s *Server) soldOutBody(sku string) []byte {
	if b, ok := s.soldOutBodies.Load(sku); ok {
		return b.([]byte)
	}
	b := s.encodedAnswer(fmt.Errorf("%w: %s is sold out", inventory.ErrInsufficientStock, sku))
	s.soldOutBodies.Store(sku, b)
	return b
}

// encodedAnswer is the body the error path writes for err.
func (s *Server) encodedAnswer(err error) []byte {
	_, body := s.answer(err)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf) // as jsonSerializer writes every answer
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		panic(err) // two strings always encode
	}
	return buf.Bytes()
}

// Handler is the server's http.Handler.
func (s *Server) Handler() http.Handler { return s.e }

// Echo exposes the router (to serve it on a listener).
func (s *Server) Echo() *echo.Echo { return s.e }

func (s *Server) readyz(c echo.Context) error {
	ctx := c.Request().Context()
	out, status := map[string]string{}, http.StatusOK
	for name, err := range s.cfg.Ready(ctx) {
		out[name] = "ok"
		if err != nil {
			out[name], status = err.Error(), http.StatusServiceUnavailable
		}
	}
	for name, err := range s.cfg.Degraded(ctx) {
		out[name] = "ok"
		if err != nil {
			out[name] = "degraded: " + err.Error()
		}
	}
	return c.JSON(status, out)
}

// routeOnEscapedPath makes the router match the path as sent, so a path
// parameter reaches its handler still percent-encoded and is decoded once,
// by pathParam. Echo matches on URL.RawPath, which Go leaves empty when the
// path as sent is the default encoding of the decoded one (W%252DX is the
// default encoding of W%2DX): Echo then matched the decoded path and the
// handler decoded W%2DX again, into W-X, another SKU. Escapes of unreserved
// characters (%2D, %41) are decoded here, as RFC 3986 6.2.2.2 normalises
// them, so /v1/%73kus/... is /v1/skus/...; every other escape stays, so %2F
// never splits a segment and %25 stays a literal "%".
func routeOnEscapedPath(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		u := c.Request().URL
		u.RawPath = decodeUnreserved(u.EscapedPath())
		return next(c)
	}
}

// decodeUnreserved decodes the escapes of unreserved characters (A-Z a-z
// 0-9 - . _ ~) in the valid escaped path p and upper-cases the others.
func decodeUnreserved(p string) string {
	if !strings.Contains(p, "%") {
		return p
	}
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		if p[i] != '%' || i+2 >= len(p) {
			b.WriteByte(p[i])
			continue
		}
		v, err := strconv.ParseUint(p[i+1:i+3], 16, 8)
		if err != nil { // EscapedPath never gives one; kept as sent
			b.WriteByte(p[i])
			continue
		}
		switch c := byte(v); {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
		}
		i += 2
	}
	return b.String()
}

// pathParam is a path segment as the client meant it: its one
// percent-decoding (routeOnEscapedPath keeps it encoded until here), so
// DEMO%2DTSHIRT names DEMO-TSHIRT and DEMO%252DTSHIRT names DEMO%2DTSHIRT,
// which no SKU can be.
func pathParam(c echo.Context, name string) (string, error) {
	v, err := url.PathUnescape(c.Param(name))
	if err != nil {
		return "", badRequest(fmt.Sprintf("the path's %s is not validly percent-encoded", name))
	}
	return v, nil
}

func skuParam(c echo.Context) (string, error) {
	sku, err := pathParam(c, "sku")
	if err != nil {
		return "", err
	}
	return sku, inventory.ValidateSKU(sku)
}

func (s *Server) putSKU(c echo.Context) error {
	sku, err := skuParam(c)
	if err != nil {
		return err
	}
	var req struct {
		Stock             *int64 `json:"stock"`
		PerUserLimit      *int64 `json:"per_user_limit"`
		LowStockThreshold *int64 `json:"low_stock_threshold"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	if err := required(map[string]bool{"stock": req.Stock != nil}); err != nil {
		return err
	}
	var limit int64
	if req.PerUserLimit != nil {
		limit = *req.PerUserLimit
	}
	ifMatch, err := ifMatch(c)
	if err != nil {
		return err
	}
	set := arbiter.Settings{OnHand: *req.Stock, PerUserLimit: limit}
	if req.LowStockThreshold != nil {
		set.LowStockThreshold = *req.LowStockThreshold
	}
	v, err := s.catalog.PutSettings(c.Request().Context(), sku, set, ifMatch...)
	if err != nil {
		return err
	}
	s.orders.LimitChanged(sku)
	return skuAnswer(c, v)
}

func (s *Server) adjustSKU(c echo.Context) error {
	sku, err := skuParam(c)
	if err != nil {
		return err
	}
	var req struct {
		Delta     *int64  `json:"delta"`
		Reason    *string `json:"reason"`
		Reference *string `json:"reference"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	if err := required(map[string]bool{"delta": req.Delta != nil, "reason": req.Reason != nil}); err != nil {
		return err
	}
	ref := ""
	if req.Reference != nil {
		ref = *req.Reference
	}
	ifMatch, err := ifMatch(c)
	if err != nil {
		return err
	}
	v, err := s.catalog.Adjust(c.Request().Context(), sku, *req.Delta, *req.Reason, ref, ifMatch...)
	if err != nil {
		return err
	}
	return skuAnswer(c, v)
}

func (s *Server) getSKU(c echo.Context) error {
	sku, err := skuParam(c)
	if err != nil {
		return err
	}
	v, err := s.skuView(c.Request().Context(), sku)
	if err != nil {
		return err
	}
	return skuAnswer(c, v)
}

// skuAnswer answers a SKU with its version as a strong ETag, for a later
// write's If-Match.
func skuAnswer(c echo.Context, v *catalog.SKUView) error {
	c.Response().Header().Set("ETag", `"`+v.Version+`"`)
	return c.JSON(http.StatusOK, v)
}

// ifMatch reads the If-Match header (RFC 9110 13.1.1): "*" or a list of
// entity tags. A weak tag (W/"...") never matches under the strong
// comparison If-Match uses, so a list of only weak tags is a failed
// precondition; a malformed header is invalid.
func ifMatch(c echo.Context) ([]string, error) {
	h := c.Request().Header.Values("If-Match")
	if len(h) == 0 {
		return nil, nil
	}
	var out []string
	for _, part := range strings.Split(strings.Join(h, ","), ",") {
		tag := strings.TrimSpace(part)
		switch {
		case tag == "*":
			out = append(out, arbiter.AnyVersion)
		case strings.HasPrefix(tag, `W/"`) && strings.HasSuffix(tag, `"`) && len(tag) >= 4:
			// weak: matches nothing
		case strings.HasPrefix(tag, `"`) && strings.HasSuffix(tag, `"`) && len(tag) >= 2 && !strings.Contains(tag[1:len(tag)-1], `"`):
			out = append(out, tag[1:len(tag)-1])
		default:
			return nil, fmt.Errorf("%w: If-Match must be * or a list of quoted entity tags", inventory.ErrInvalidArgument)
		}
	}
	if len(out) == 0 {
		out = []string{"weak"} // only weak tags: no version is spelled so, nothing matches
	}
	return out, nil
}

// deduct, commit and release are the token API: reservations named by the
// client's token, in a namespace orders never share.
func (s *Server) deduct(c echo.Context) error {
	var req struct {
		SKU   *string `json:"sku"`
		Qty   *int64  `json:"qty"`
		Token *string `json:"token"`
		Hold  *int64  `json:"hold_seconds"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	if err := required(map[string]bool{"sku": req.SKU != nil, "qty": req.Qty != nil, "token": req.Token != nil}); err != nil {
		return err
	}
	hold, err := holdParam(req.Hold)
	if err != nil {
		return err
	}
	h, err := s.tokens.ReserveHold(c.Request().Context(), *req.SKU, *req.Qty, *req.Token, hold)
	s.cfg.Metrics.deduction(err, h.Result)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, deducted{Result: h.Result, ExpiresAt: h.ExpiresAt})
}

type deducted struct {
	Result    int64     `json:"result"`
	ExpiresAt time.Time `json:"expires_at"`
}

// holdParam is hold_seconds as a duration (nil: 0, the default hold); the
// services check it against their bounds.
func holdParam(seconds *int64) (time.Duration, error) {
	if seconds == nil {
		return 0, nil
	}
	if *seconds <= 0 {
		return 0, badRequest("hold_seconds must be a positive number of seconds")
	}
	return inventory.Seconds(*seconds), nil
}

// secondsParam is an extension's required {"seconds"} as a duration.
func secondsParam(seconds *int64) (time.Duration, error) {
	if err := required(map[string]bool{"seconds": seconds != nil}); err != nil {
		return 0, err
	}
	if *seconds <= 0 {
		return 0, badRequest("seconds must be a positive number of seconds")
	}
	return inventory.Seconds(*seconds), nil
}

// extendHold moves the end of a token-API hold: {"sku","token","seconds"},
// with an optional Idempotency-Key.
func (s *Server) extendHold(c echo.Context) error {
	var req struct {
		SKU     *string `json:"sku"`
		Token   *string `json:"token"`
		Seconds *int64  `json:"seconds"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	if err := required(map[string]bool{"sku": req.SKU != nil, "token": req.Token != nil}); err != nil {
		return err
	}
	by, err := secondsParam(req.Seconds)
	if err != nil {
		return err
	}
	until, err := s.tokens.Extend(c.Request().Context(), *req.SKU, *req.Token, c.Request().Header.Get("Idempotency-Key"), by)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]time.Time{"expires_at": until})
}

// tokenReq reads the {"sku","token"} body of commit and release.
func tokenReq(c echo.Context) (sku, token string, err error) {
	var req struct {
		SKU   *string `json:"sku"`
		Token *string `json:"token"`
	}
	if err := bind(c, &req); err != nil {
		return "", "", err
	}
	if err := required(map[string]bool{"sku": req.SKU != nil, "token": req.Token != nil}); err != nil {
		return "", "", err
	}
	return *req.SKU, *req.Token, nil
}

func (s *Server) commit(c echo.Context) error {
	sku, token, err := tokenReq(c)
	if err != nil {
		return err
	}
	q, err := s.tokens.Commit(c.Request().Context(), sku, token)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]int64{"committed": q})
}

func (s *Server) release(c echo.Context) error {
	sku, token, err := tokenReq(c)
	if err != nil {
		return err
	}
	q, err := s.tokens.Release(c.Request().Context(), sku, token)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]int64{"released": q})
}

type itemReq struct {
	SKU *string `json:"sku"`
	Qty *int64  `json:"qty"`
}

// created answers 201 with the order and its Location.
func created(c echo.Context, o *order.Order) error {
	c.Response().Header().Set(echo.HeaderLocation, "/v1/orders/"+o.ID)
	return c.JSON(http.StatusCreated, o)
}

// createOrder places an order for the buyer X-Buyer-Token names; user_id in
// the body is optional and, when given, must be that buyer.
func (s *Server) createOrder(c echo.Context) error {
	var req struct {
		UserID *string   `json:"user_id"`
		Items  []itemReq `json:"items"`
		Hold   *int64    `json:"hold_seconds"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	if err := required(map[string]bool{"items": req.Items != nil}); err != nil {
		return err
	}
	hold, err := holdParam(req.Hold)
	if err != nil {
		return err
	}
	user, err := s.buyer(c, req.UserID)
	if err != nil {
		return err
	}
	lines := make([]inventory.Line, len(req.Items))
	for i, it := range req.Items {
		if it.SKU == nil || it.Qty == nil {
			return badRequest(fmt.Sprintf("items[%d] needs sku and qty", i))
		}
		lines[i] = inventory.Line{SKU: *it.SKU, Qty: *it.Qty}
	}
	o, err := s.orders.CreateHold(c.Request().Context(), user, c.Request().Header.Get("Idempotency-Key"), lines, hold)
	s.cfg.Metrics.deduction(err, 0)
	if err != nil {
		return err
	}
	return created(c, o)
}

func (s *Server) getOrder(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	o, err := s.orders.Get(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

// cancelOrder: the buyer who placed the order (X-Buyer-Token), or an admin.
func (s *Server) cancelOrder(c echo.Context) error {
	ctx := c.Request().Context()
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	if !isAdmin(c) {
		user, err := s.buyer(c, nil)
		if err != nil {
			return err
		}
		o, err := s.orders.Get(ctx, id)
		if err != nil {
			return err
		}
		if o.UserID != user {
			return forbidden("the order belongs to another buyer")
		}
	}
	o, err := s.orders.Cancel(ctx, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

// extendOrder moves an unpaid order's deadline: {"seconds"} from now, for
// the buyer who placed it (X-Buyer-Token) or an admin, with an optional
// Idempotency-Key.
func (s *Server) extendOrder(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	var req struct {
		Seconds *int64 `json:"seconds"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	by, err := secondsParam(req.Seconds)
	if err != nil {
		return err
	}
	user := "" // an admin may extend any order
	if !isAdmin(c) {
		if user, err = s.buyer(c, nil); err != nil {
			return err
		}
	}
	o, err := s.orders.Extend(c.Request().Context(), id, user, c.Request().Header.Get("Idempotency-Key"), by)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

func (s *Server) refundOrder(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	o, err := s.orders.Refund(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

// paymentCallback: X-Signature is hex HMAC-SHA256(secret, X-Timestamp + "." +
// body), X-Timestamp is unix seconds within the replay window. A replay of a
// valid callback is answered from the order (idempotent by payment id).
func (s *Server) paymentCallback(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	ts, sig := c.Request().Header.Get("X-Timestamp"), c.Request().Header.Get("X-Signature")
	if ts == "" || sig == "" {
		return unauthorized("X-Timestamp and X-Signature are required", callbackChallenge)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return unauthorized("X-Timestamp must be unix seconds", callbackChallenge)
	}
	if age := s.cfg.Now().Sub(time.Unix(sec, 0)); age > s.cfg.ReplayWindow || age < -s.cfg.ReplayWindow {
		return unauthorized("X-Timestamp is outside the replay window", callbackChallenge)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, Sign(s.cfg.PaymentSecret, ts, body)) {
		return unauthorized("X-Signature does not match", callbackChallenge)
	}
	var req struct {
		OrderID   *string `json:"order_id"`
		PaymentID *string `json:"payment_id"`
		Status    *string `json:"status"`
	}
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	if err := required(map[string]bool{"order_id": req.OrderID != nil, "payment_id": req.PaymentID != nil, "status": req.Status != nil}); err != nil {
		return err
	}
	ctx := c.Request().Context()
	switch *req.Status {
	case "SUCCESS":
		o, err := s.orders.Pay(ctx, *req.OrderID, *req.PaymentID)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, o)
	case "FAILED":
		o, err := s.orders.Get(ctx, *req.OrderID) // nothing to do: the order waits or times out
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, o)
	}
	return badRequest(`status must be "SUCCESS" or "FAILED"`)
}

// callbackChallenge names the callback's scheme on a 401.
const callbackChallenge = `HMAC-SHA256 realm="payments", headers="X-Timestamp X-Signature"`

// Sign is the callback signature: HMAC-SHA256(secret, timestamp + "." +
// body), the scheme webhook deliveries are signed with too (inventory.Sign).
func Sign(secret, timestamp string, body []byte) []byte {
	return inventory.Sign(secret, timestamp, body)
}

// seckill buys one unit for a user. A SKU known to be sold out is answered
// from memory; the per-user limit is taken atomically in Redis first and given
// back if the purchase fails.
func (s *Server) seckill(c echo.Context) error {
	sku, err := skuParam(c)
	if err != nil {
		return err
	}
	var req struct {
		UserID *string `json:"user_id"`
		Hold   *int64  `json:"hold_seconds"`
	}
	body, err := readBody(c)
	if err != nil {
		return err
	}
	// The buyer token names the buyer: a body is optional, and the empty
	// object (what most clients send) needs no decoding.
	if b := bytes.TrimSpace(body); len(b) > 0 && string(b) != "{}" {
		if err := decodeJSON(body, &req); err != nil {
			return err
		}
	}
	// Sold out is answered before the buyer token is verified: it costs
	// nothing and tells nothing about anyone.
	if s.soldOut.Is(sku) {
		s.cfg.Metrics.soldOutFlag.Inc()
		return c.JSONBlob(http.StatusConflict, s.soldOutBody(sku))
	}
	hold, err := holdParam(req.Hold)
	if err != nil {
		return err
	}
	user, err := s.buyer(c, req.UserID)
	if err != nil {
		return err
	}
	o, err := s.orders.Buy(c.Request().Context(), order.Buy{Kind: order.Seckill, User: user,
		Lines: []inventory.Line{{SKU: sku, Qty: 1}}, Hold: hold})
	s.cfg.Metrics.deduction(err, 0)
	if err != nil {
		if errors.Is(err, inventory.ErrInsufficientStock) {
			s.soldOut.Set(sku)
		}
		return err
	}
	return created(c, o)
}
