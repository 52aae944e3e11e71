// Package identity verifies who a buyer is. The storefront signs a short
// JWT for its logged-in buyer (subject = the buyer's user id); the checkout
// backend passes it along in the X-Buyer-Token header, and the per-user limit
// keys on the verified subject, never on a field the caller could set.
//
// The key is either an HMAC secret (HS256, shared with the storefront) or a
// PEM public key (RS256/PS256 for RSA, ES256 for P-256, EdDSA for Ed25519),
// so the storefront can keep the private half to itself.
package identity

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/acme/inventory"
)

// Header carries the buyer's token.
const Header = "X-Buyer-Token"

// ErrInvalid: the buyer token is missing, malformed, expired, or not signed
// with the configured key.
var ErrInvalid = errors.New("invalid buyer token")

// The defaults of Options: the audience a buyer token must name (this
// service), the issuer it must come from (the storefront), and the longest
// it may be valid from the moment it is checked.
const (
	DefaultAudience = "inventory"
	DefaultIssuer   = "storefront"
	DefaultMaxTTL   = 24 * time.Hour
)

// Options are what a token must say besides its signature. Zero values are
// the defaults.
type Options struct {
	// Audience must be one of the token's aud; Issuer its iss. A token
	// signed with the same key for another service names another audience.
	Audience, Issuer string
	// MaxTTL bounds exp: a token valid for longer is refused, so a leaked
	// one cannot be used for years.
	MaxTTL time.Duration
	// Now is the clock (tests inject one).
	Now func() time.Time
}

// Verifier checks buyer tokens against one key.
type Verifier struct {
	key      any
	methods  []string
	leeway   time.Duration
	audience string
	issuer   string
	maxTTL   time.Duration
	now      func() time.Time

	// verified remembers tokens that verified, keyed by the whole token
	// string (header, claims and signature), until their exp: a buyer's
	// next request skips the signature check and the claims' parsing, which
	// were 6-14% of a seckill sale. A token that differs in any byte is
	// another key, verified in full. Bounded by cacheSize.
	mu       sync.RWMutex
	verified map[string]verifiedToken
}

// verifiedToken is what a verified token named: its subject and its exp.
type verifiedToken struct {
	sub string
	exp time.Time
}

// cacheSize bounds the verified tokens a Verifier remembers: at a few
// hundred bytes each, a few MiB. Past it, an arbitrary one is forgotten
// (and verified in full again if it comes back).
const cacheSize = 16384

// NewVerifier reads key: a PEM public key, or else an HMAC secret of at least
// 32 bytes. Tokens must carry exp, the audience and issuer of opts, and a sub
// that is a valid user id.
func NewVerifier(key string, opts Options) (*Verifier, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Audience == "" {
		opts.Audience = DefaultAudience
	}
	if opts.Issuer == "" {
		opts.Issuer = DefaultIssuer
	}
	if opts.MaxTTL == 0 {
		opts.MaxTTL = DefaultMaxTTL
	}
	if opts.MaxTTL < time.Minute {
		return nil, fmt.Errorf("the buyer token maximum lifetime must be at least 1m, got %s", opts.MaxTTL)
	}
	v := &Verifier{leeway: 30 * time.Second, audience: opts.Audience, issuer: opts.Issuer, maxTTL: opts.MaxTTL, now: opts.Now,
		verified: map[string]verifiedToken{}}
	if IsPublicKey(key) {
		pub, methods, err := parsePublicKey([]byte(key))
		if err != nil {
			return nil, err
		}
		v.key, v.methods = pub, methods
		return v, nil
	}
	if len(key) < 32 {
		return nil, errors.New("the buyer token key must be a PEM public key or an HMAC secret of at least 32 bytes")
	}
	v.key, v.methods = []byte(key), []string{"HS256"}
	return v, nil
}

// IsPublicKey reports whether key is given as PEM (a public key: nothing to
// sign with, and not a secret to measure); otherwise it is an HMAC secret.
func IsPublicKey(key string) bool {
	return strings.HasPrefix(strings.TrimSpace(key), "-----BEGIN")
}

func parsePublicKey(pemKey []byte) (any, []string, error) {
	if k, err := jwt.ParseRSAPublicKeyFromPEM(pemKey); err == nil {
		if k.N.BitLen() < 2048 {
			return nil, nil, errors.New("the buyer token RSA key must have at least 2048 bits")
		}
		return k, []string{"RS256", "PS256"}, nil
	}
	if k, err := jwt.ParseECPublicKeyFromPEM(pemKey); err == nil {
		return k, []string{"ES256"}, nil
	}
	if k, err := jwt.ParseEdPublicKeyFromPEM(pemKey); err == nil {
		return k, []string{"EdDSA"}, nil
	}
	return nil, nil, errors.New("the buyer token key is PEM but not an RSA, ECDSA or Ed25519 public key")
}

// Buyer returns the user id a valid token names. A token verified before
// is answered from memory until its exp (with the same leeway): every other
// check it passed (signature, algorithm, audience, issuer, subject, not
// before, exp at most MaxTTL ahead) cannot fail later on a clock that goes
// forward.
func (v *Verifier) Buyer(token string) (string, error) {
	if token == "" {
		return "", fmt.Errorf("%w: the %s header is required", ErrInvalid, Header)
	}
	v.mu.RLock()
	t, ok := v.verified[token]
	v.mu.RUnlock()
	if ok && v.now().Before(t.exp.Add(v.leeway)) {
		return t.sub, nil
	}
	if ok {
		v.forget(token)
	}
	sub, exp, err := v.verify(token)
	if err != nil {
		return "", err
	}
	v.remember(token, verifiedToken{sub: sub, exp: exp})
	return sub, nil
}

func (v *Verifier) forget(token string) {
	v.mu.Lock()
	delete(v.verified, token)
	v.mu.Unlock()
}

// remember records a verified token, forgetting an arbitrary other one
// when the cache is full.
func (v *Verifier) remember(token string, t verifiedToken) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.verified[token]; !ok && len(v.verified) >= cacheSize {
		for k := range v.verified {
			delete(v.verified, k)
			break
		}
	}
	v.verified[token] = t
}

// verify checks token in full: its signature and every claim. It returns
// the subject and the exp.
func (v *Verifier) verify(token string) (string, time.Time, error) {
	var claims jwt.RegisteredClaims
	_, err := jwt.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return v.key, nil },
		jwt.WithValidMethods(v.methods), jwt.WithExpirationRequired(), jwt.WithLeeway(v.leeway),
		jwt.WithTimeFunc(v.now), jwt.WithAudience(v.audience), jwt.WithIssuer(v.issuer))
	claimsWrong := errors.Is(err, jwt.ErrTokenRequiredClaimMissing) || errors.Is(err, jwt.ErrTokenInvalidAudience) ||
		errors.Is(err, jwt.ErrTokenInvalidIssuer)
	switch {
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		return "", time.Time{}, fmt.Errorf("%w: its signature does not verify with the configured key", ErrInvalid)
	case errors.Is(err, jwt.ErrTokenExpired):
		return "", time.Time{}, fmt.Errorf("%w: it has expired", ErrInvalid)
	case claimsWrong && claims.ExpiresAt == nil:
		return "", time.Time{}, fmt.Errorf("%w: it must carry exp", ErrInvalid)
	case claimsWrong && !slices.Contains(claims.Audience, v.audience):
		return "", time.Time{}, fmt.Errorf("%w: its aud must name %q", ErrInvalid, v.audience)
	case claimsWrong && claims.Issuer != v.issuer:
		return "", time.Time{}, fmt.Errorf("%w: its iss must be %q", ErrInvalid, v.issuer)
	case err != nil:
		return "", time.Time{}, fmt.Errorf("%w: %s", ErrInvalid, "it is malformed or not yet valid")
	}
	if claims.ExpiresAt.Sub(v.now()) > v.maxTTL+v.leeway {
		return "", time.Time{}, fmt.Errorf("%w: its exp is more than %s ahead; sign buyer tokens for less", ErrInvalid, shortDuration(v.maxTTL))
	}
	if inventory.ValidateUserID(claims.Subject) != nil {
		return "", time.Time{}, fmt.Errorf("%w: its sub must be a user id (1-64 characters of A-Z a-z 0-9 . _ : -)", ErrInvalid)
	}
	return claims.Subject, claims.ExpiresAt.Time, nil
}

// shortDuration writes 24h, not 24h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// Issue signs a token for user valid for ttl with an HMAC secret, for the
// default audience and issuer: what a storefront does (the embedded default
// uses it for its demo buyers, and tests for theirs).
func Issue(secret, user string, ttl time.Duration) (string, error) {
	return IssueFor(secret, user, DefaultIssuer, DefaultAudience, ttl)
}

// IssueFor is Issue for a given issuer and audience.
func IssueFor(secret, user, issuer, audience string, ttl time.Duration) (string, error) {
	now := time.Now()
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Issuer:    issuer,
		Audience:  jwt.ClaimStrings{audience},
		Subject:   user,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}).SignedString([]byte(secret))
}
