package httpapi

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/acme/inventory/internal/identity"
)

// Who may call what (docs/api.md, "Credentials"):
//
//	admin routes      Authorization: Bearer <admin token> (a client credential: 403)
//	client routes     Authorization: Bearer <a client credential> (or the admin token)
//	buyer actions     a client credential and X-Buyer-Token: <JWT the storefront signed>
//	payment callback  X-Timestamp and X-Signature (HMAC-SHA256 with the payment secret)
//
// Several client credentials may be configured at once, so one can be
// rotated without downtime: add the new one, move the callers, drop the old.

const bearerChallenge = `Bearer realm="inventory"`

// buyerChallenge names the buyer token's own scheme: a JWT in X-Buyer-Token,
// not a bearer credential in Authorization.
const buyerChallenge = `JWT realm="buyer", header="X-Buyer-Token"`

// hasToken reports whether got equals one of want, in constant time per
// candidate (every candidate is compared, whichever matches).
func hasToken(got string, want ...string) bool {
	ok := 0
	for _, w := range want {
		if w != "" {
			ok |= subtle.ConstantTimeCompare([]byte(got), []byte(w))
		}
	}
	return ok == 1
}

// bearerToken is the credential of an "Authorization: Bearer <token>"
// header (the scheme is case-insensitive); "" for anything else.
func bearerToken(c echo.Context) string {
	scheme, tok, ok := strings.Cut(c.Request().Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return tok
}

// requireAdmin lets only the admin token through. A client credential is a
// caller the service knows but does not allow here: 403, not 401.
func (s *Server) requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		got := bearerToken(c)
		switch {
		case hasToken(got, s.cfg.AdminToken):
			return next(c)
		case hasToken(got, s.cfg.ClientTokens...):
			return forbidden("this route needs the admin token; a client credential may not call it")
		}
		return unauthorized("this route needs the admin token (Authorization: Bearer <admin token>)", bearerChallenge)
	}
}

// requireClient lets a client credential or the admin token through; it
// records which in the context (isAdmin).
func (s *Server) requireClient(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		got := bearerToken(c)
		switch {
		case hasToken(got, s.cfg.ClientTokens...):
		case hasToken(got, s.cfg.AdminToken):
			c.Set(ctxAdmin, true)
		default:
			return unauthorized("this route needs a client credential (Authorization: Bearer <client token>)", bearerChallenge)
		}
		return next(c)
	}
}

const ctxAdmin = "inventory.admin"

func isAdmin(c echo.Context) bool { v, _ := c.Get(ctxAdmin).(bool); return v }

// buyer is the user id the request's X-Buyer-Token names. A body that names
// a user must name the same one: a caller cannot act as another buyer.
func (s *Server) buyer(c echo.Context, bodyUser *string) (string, error) {
	user, err := s.cfg.Buyers.Buyer(c.Request().Header.Get(identity.Header))
	if err != nil {
		return "", unauthorized(err.Error(), buyerChallenge)
	}
	if bodyUser != nil && *bodyUser != user {
		return "", forbidden("user_id does not match the buyer the X-Buyer-Token names")
	}
	return user, nil
}

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:/+=-]{1,128}$`)

// requestIDs makes the ids of requests that bring none: UUIDs (version 8,
// RFC 9562) of this process's random half and a counter. They name a request
// in the logs; they need to be unique, not secret, so they cost no random
// read per request.
var requestIDs struct {
	prefix [8]byte
	n      atomic.Uint64
}

func init() {
	_, _ = rand.Read(requestIDs.prefix[:])                  // crypto/rand.Read never fails (Go 1.24+)
	requestIDs.prefix[6] = requestIDs.prefix[6]&0x0f | 0x80 // version 8
}

func newRequestID() string {
	var u uuid.UUID
	copy(u[:8], requestIDs.prefix[:])
	binary.BigEndian.PutUint64(u[8:], requestIDs.n.Add(1))
	u[8] = u[8]&0x3f | 0x80 // the RFC 9562 variant
	return u.String()
}

// requestID accepts the caller's X-Request-ID when it is a sane token
// (otherwise makes one), echoes it, and keeps it for the logs.
func requestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		id := c.Request().Header.Get(echo.HeaderXRequestID)
		if id == "" || !requestIDPattern.MatchString(id) {
			id = newRequestID()
		}
		c.Response().Header().Set(echo.HeaderXRequestID, id) // where requestIDOf reads it: no per-request map
		return next(c)
	}
}

func requestIDOf(c echo.Context) string { return c.Response().Header().Get(echo.HeaderXRequestID) }

// ipExtractor decides which address a request comes from. By default the
// connection's remote address: X-Forwarded-For and X-Real-IP are ignored, so
// a client cannot choose its own rate-limit bucket. With trusted proxies
// configured, X-Forwarded-For is read from the right, past those proxies
// only.
func ipExtractor(trusted []*net.IPNet) echo.IPExtractor {
	if len(trusted) == 0 {
		return echo.ExtractIPDirect()
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, n := range trusted {
		opts = append(opts, echo.TrustIPRange(n))
	}
	return echo.ExtractIPFromXFFHeader(opts...)
}

// limiterStore is the seckill rate limit: a token bucket per client address,
// kept in an LRU of bounded size, so a flood of addresses costs bounded
// memory (the least recently seen bucket is dropped first).
type limiterStore struct {
	limit   rate.Limit
	burst   int
	buckets *lru.Cache[string, *rate.Limiter]
}

func newLimiterStore(perSecond float64, maxClients int) *limiterStore {
	buckets, err := lru.New[string, *rate.Limiter](maxClients)
	if err != nil {
		panic(err) // only for a size <= 0, which New never passes
	}
	return &limiterStore{limit: rate.Limit(perSecond), burst: max(1, int(2*perSecond)), buckets: buckets}
}

func (l *limiterStore) Allow(client string) (bool, error) {
	b, ok := l.buckets.Get(client)
	if !ok {
		b = rate.NewLimiter(l.limit, l.burst)
		if prev, found, _ := l.buckets.PeekOrAdd(client, b); found {
			b = prev
		}
	}
	return b.Allow(), nil
}

// retryAfter is the Retry-After for a refused request: the time one token
// takes to come back, in whole seconds.
func (l *limiterStore) retryAfter() string {
	return strconv.Itoa(int(math.Ceil(1 / float64(l.limit))))
}

func rateLimited(retryAfter string) error {
	return &apiError{status: http.StatusTooManyRequests, code: "rate_limited",
		msg: "too many requests from this client; slow down", header: [2]string{"Retry-After", retryAfter}}
}

func forbidden(msg string) error {
	return &apiError{status: http.StatusForbidden, code: "forbidden", msg: msg}
}

func unauthorized(msg, challenge string) error {
	return &apiError{status: http.StatusUnauthorized, code: "unauthorized", msg: msg,
		header: [2]string{"WWW-Authenticate", challenge}}
}

// ParseCIDRs reads trusted proxy addresses: CIDRs, or single addresses.
func ParseCIDRs(list []string) ([]*net.IPNet, error) {
	var out []*net.IPNet
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !strings.Contains(s, "/") {
			ip := net.ParseIP(s)
			if ip == nil {
				return nil, fmt.Errorf("%q is not an IP address or CIDR", s)
			}
			bits := 128
			if ip.To4() != nil {
				ip, bits = ip.To4(), 32
			}
			out = append(out, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
			continue
		}
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address or CIDR", s)
		}
		out = append(out, n)
	}
	return out, nil
}
