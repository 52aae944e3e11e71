package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
)

func publicPEM(t *testing.T, pub crypto.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func claims(sub string) jwt.RegisteredClaims {
	return jwt.RegisteredClaims{Subject: sub, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
		Issuer: DefaultIssuer, Audience: jwt.ClaimStrings{DefaultAudience}}
}

// A storefront that keeps its private key signs with RS256, PS256, ES256 or
// EdDSA; the service verifies with the public half, and refuses a token
// signed with another algorithm or key, including an HS256 token "signed"
// with the public key's text (the classic algorithm-confusion attack).
func TestPublicKeys(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	edPub, edKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	for _, c := range []struct {
		name   string
		pub    crypto.PublicKey
		method jwt.SigningMethod
		key    any
	}{
		{"RS256", &rsaKey.PublicKey, jwt.SigningMethodRS256, rsaKey},
		{"PS256", &rsaKey.PublicKey, jwt.SigningMethodPS256, rsaKey},
		{"ES256", &ecKey.PublicKey, jwt.SigningMethodES256, ecKey},
		{"EdDSA", edPub, jwt.SigningMethodEdDSA, edKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			pemKey := publicPEM(t, c.pub)
			v, err := NewVerifier(pemKey, Options{})
			require.NoError(t, err)
			tok, err := jwt.NewWithClaims(c.method, claims("alice")).SignedString(c.key)
			require.NoError(t, err)
			user, err := v.Buyer(tok)
			require.NoError(t, err)
			require.Equal(t, "alice", user)

			confused, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims("mallory")).SignedString([]byte(pemKey))
			require.NoError(t, err)
			_, err = v.Buyer(confused)
			require.ErrorIs(t, err, ErrInvalid)
			require.EqualError(t, err, "invalid buyer token: its signature does not verify with the configured key")
		})
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	v, err := NewVerifier(publicPEM(t, &rsaKey.PublicKey), Options{})
	require.NoError(t, err)
	tok, err := jwt.NewWithClaims(jwt.SigningMethodRS256, claims("alice")).SignedString(other)
	require.NoError(t, err)
	_, err = v.Buyer(tok)
	require.ErrorIs(t, err, ErrInvalid)
}

func TestKeysRefused(t *testing.T) {
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	_, err = NewVerifier(publicPEM(t, &small.PublicKey), Options{})
	require.EqualError(t, err, "the buyer token RSA key must have at least 2048 bits")
	_, err = NewVerifier("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n", Options{})
	require.EqualError(t, err, "the buyer token key is PEM but not an RSA, ECDSA or Ed25519 public key")
	_, err = NewVerifier("too-short", Options{})
	require.EqualError(t, err, "the buyer token key must be a PEM public key or an HMAC secret of at least 32 bytes")
}

// Expiry is checked against the injected clock, with 30 s of leeway.
func TestExpiryUsesTheClock(t *testing.T) {
	const key = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	now := time.Now()
	v, err := NewVerifier(key, Options{Now: func() time.Time { return now }})
	require.NoError(t, err)
	tok, err := Issue(key, "alice", time.Minute)
	require.NoError(t, err)
	_, err = v.Buyer(tok)
	require.NoError(t, err)
	now = now.Add(time.Minute + 20*time.Second)
	_, err = v.Buyer(tok)
	require.NoError(t, err, "within the leeway")
	now = now.Add(20 * time.Second)
	_, err = v.Buyer(tok)
	require.EqualError(t, err, "invalid buyer token: it has expired")
}

// A token is for this service from the storefront, and short-lived: one
// minted with the same key for another audience, by another issuer, or
// valid for longer than the maximum lifetime is refused, each with its
// reason. The defaults are aud "inventory", iss "storefront", 24h.
func TestAudienceIssuerAndLifetime(t *testing.T) {
	const key = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	sign := func(c jwt.MapClaims) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(key))
		require.NoError(t, err)
		return tok
	}
	now := time.Now()
	hour := now.Add(time.Hour).Unix()
	v, err := NewVerifier(key, Options{})
	require.NoError(t, err)
	for name, c := range map[string]struct {
		claims jwt.MapClaims
		err    string
	}{
		"valid":            {jwt.MapClaims{"sub": "alice", "exp": hour, "aud": "inventory", "iss": "storefront"}, ""},
		"aud in a list":    {jwt.MapClaims{"sub": "alice", "exp": hour, "aud": []string{"search", "inventory"}, "iss": "storefront"}, ""},
		"23h59m ahead":     {jwt.MapClaims{"sub": "alice", "exp": now.Add(24*time.Hour - time.Minute).Unix(), "aud": "inventory", "iss": "storefront"}, ""},
		"ten years ahead":  {jwt.MapClaims{"sub": "alice", "exp": now.AddDate(10, 0, 0).Unix(), "aud": "inventory", "iss": "storefront"}, "invalid buyer token: its exp is more than 24h ahead; sign buyer tokens for less"},
		"25h ahead":        {jwt.MapClaims{"sub": "alice", "exp": now.Add(25 * time.Hour).Unix(), "aud": "inventory", "iss": "storefront"}, "invalid buyer token: its exp is more than 24h ahead; sign buyer tokens for less"},
		"no aud":           {jwt.MapClaims{"sub": "alice", "exp": hour, "iss": "storefront"}, `invalid buyer token: its aud must name "inventory"`},
		"another audience": {jwt.MapClaims{"sub": "alice", "exp": hour, "aud": "search", "iss": "storefront"}, `invalid buyer token: its aud must name "inventory"`},
		"no iss":           {jwt.MapClaims{"sub": "alice", "exp": hour, "aud": "inventory"}, `invalid buyer token: its iss must be "storefront"`},
		"another issuer":   {jwt.MapClaims{"sub": "alice", "exp": hour, "aud": "inventory", "iss": "elsewhere"}, `invalid buyer token: its iss must be "storefront"`},
		"no exp":           {jwt.MapClaims{"sub": "alice", "aud": "inventory", "iss": "storefront"}, "invalid buyer token: it must carry exp"},
	} {
		user, err := v.Buyer(sign(c.claims))
		if c.err == "" {
			require.NoError(t, err, name)
			require.Equal(t, "alice", user, name)
			continue
		}
		require.ErrorIs(t, err, ErrInvalid, name)
		require.EqualError(t, err, c.err, name)
	}

	// Configured: another audience, issuer and lifetime.
	v, err = NewVerifier(key, Options{Audience: "stock", Issuer: "https://shop.example", MaxTTL: 10 * time.Minute})
	require.NoError(t, err)
	_, err = v.Buyer(sign(jwt.MapClaims{"sub": "alice", "exp": now.Add(5 * time.Minute).Unix(), "aud": "stock", "iss": "https://shop.example"}))
	require.NoError(t, err)
	_, err = v.Buyer(sign(jwt.MapClaims{"sub": "alice", "exp": hour, "aud": "stock", "iss": "https://shop.example"}))
	require.EqualError(t, err, "invalid buyer token: its exp is more than 10m ahead; sign buyer tokens for less")
	_, err = v.Buyer(sign(jwt.MapClaims{"sub": "alice", "exp": now.Add(5 * time.Minute).Unix(), "aud": "inventory", "iss": "https://shop.example"}))
	require.EqualError(t, err, `invalid buyer token: its aud must name "stock"`)
	tok, err := IssueFor(key, "alice", "https://shop.example", "stock", 5*time.Minute)
	require.NoError(t, err)
	_, err = v.Buyer(tok)
	require.NoError(t, err, "IssueFor signs for the audience and issuer given")

	_, err = NewVerifier(key, Options{MaxTTL: time.Second})
	require.EqualError(t, err, "the buyer token maximum lifetime must be at least 1m, got 1s")
}

// A verified token is remembered by its whole string until its exp: the
// same token again is answered from memory, a token that differs in one byte
// (of its claims or of its signature) is verified in full and refused, a
// remembered token past its exp is refused and forgotten, and the memory is
// bounded.
func TestVerifiedTokensAreRememberedUntilTheirExp(t *testing.T) {
	const key = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	now := time.Now()
	v, err := NewVerifier(key, Options{Now: func() time.Time { return now }})
	require.NoError(t, err)
	tok, err := Issue(key, "alice", time.Minute)
	require.NoError(t, err)
	user, err := v.Buyer(tok)
	require.NoError(t, err)
	require.Equal(t, "alice", user)
	require.Len(t, v.verified, 1)
	user, err = v.Buyer(tok)
	require.NoError(t, err)
	require.Equal(t, "alice", user)

	// One byte changed: in the claims (bob for alice would need the key),
	// and in the middle of the signature.
	claimsAt := strings.IndexByte(tok, '.') + 5
	sigAt := strings.LastIndexByte(tok, '.') + 10
	for _, at := range []int{claimsAt, sigAt} {
		forged := []byte(tok)
		if forged[at] == 'A' {
			forged[at] = 'B'
		} else {
			forged[at] = 'A'
		}
		_, err = v.Buyer(string(forged))
		require.ErrorIs(t, err, ErrInvalid, "byte %d", at)
		require.NotContains(t, v.verified, string(forged))
	}
	_, err = v.Buyer(tok[:sigAt] + tok[sigAt+1:])
	require.ErrorIs(t, err, ErrInvalid, "a byte removed")
	require.Len(t, v.verified, 1, "only the token that verified is remembered")

	// Past its exp (and the leeway), the remembered token is refused.
	now = now.Add(time.Minute + 31*time.Second)
	_, err = v.Buyer(tok)
	require.EqualError(t, err, "invalid buyer token: it has expired")
	require.Empty(t, v.verified)

	// Bounded: past cacheSize tokens, older ones are forgotten.
	now = time.Now()
	for i := range cacheSize + 10 {
		tok, err := Issue(key, fmt.Sprintf("buyer%d", i), time.Hour)
		require.NoError(t, err)
		user, err := v.Buyer(tok)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("buyer%d", i), user)
	}
	require.Len(t, v.verified, cacheSize)
}

// What a buyer's request spends on its token: verified in full (the first
// request, or a token not seen before) and remembered (the next ones).
func BenchmarkBuyer(b *testing.B) {
	const key = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	tok, err := Issue(key, "alice", time.Hour)
	require.NoError(b, err)
	b.Run("full", func(b *testing.B) {
		v, err := NewVerifier(key, Options{})
		require.NoError(b, err)
		for b.Loop() {
			if _, _, err := v.verify(tok); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("remembered", func(b *testing.B) {
		v, err := NewVerifier(key, Options{})
		require.NoError(b, err)
		for b.Loop() {
			if _, err := v.Buyer(tok); err != nil {
				b.Fatal(err)
			}
		}
	})
}
