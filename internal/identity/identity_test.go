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
	return jwt.RegisteredClaims{Subject: sub, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}
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
			v, err := NewVerifier(pemKey, nil)
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
	v, err := NewVerifier(publicPEM(t, &rsaKey.PublicKey), nil)
	require.NoError(t, err)
	tok, err := jwt.NewWithClaims(jwt.SigningMethodRS256, claims("alice")).SignedString(other)
	require.NoError(t, err)
	_, err = v.Buyer(tok)
	require.ErrorIs(t, err, ErrInvalid)
}

func TestKeysRefused(t *testing.T) {
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	_, err = NewVerifier(publicPEM(t, &small.PublicKey), nil)
	require.EqualError(t, err, "the buyer token RSA key must have at least 2048 bits")
	_, err = NewVerifier("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n", nil)
	require.EqualError(t, err, "the buyer token key is PEM but not an RSA, ECDSA or Ed25519 public key")
	_, err = NewVerifier("too-short", nil)
	require.EqualError(t, err, "the buyer token key must be a PEM public key or an HMAC secret of at least 32 bytes")
}

// Expiry is checked against the injected clock, with 30 s of leeway.
func TestExpiryUsesTheClock(t *testing.T) {
	const key = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	now := time.Now()
	v, err := NewVerifier(key, func() time.Time { return now })
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
