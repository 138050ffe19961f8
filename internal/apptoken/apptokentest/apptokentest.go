// Package apptokentest makes subject tokens for tests: a JWK Set served
// over HTTP, tokens signed with its key or with an HMAC secret, and
// unsigned ones (alg "none").
package apptokentest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// JWKS is a key set served over HTTP with one EC P-256 key, "k1", alg ES256.
type JWKS struct {
	Key *ecdsa.PrivateKey
	URL string
	// PublicDER is the public key's bytes (PKIX DER), what an attacker
	// would use as an HMAC secret.
	PublicDER []byte
}

// NewJWKS serves a key set until the test ends.
func NewJWKS(t testing.TB) *JWKS {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := key.PublicKey.ECDH()
	raw := pub.Bytes() // 0x04 || X || Y
	set, _ := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
		"x": b64(raw[1:33]), "y": b64(raw[33:]),
	}}})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(set)
	}))
	t.Cleanup(srv.Close)
	return &JWKS{Key: key, URL: srv.URL, PublicDER: der}
}

// Sign signs claims with the set's key (ES256, kid k1).
func (j *JWKS) Sign(t testing.TB, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	tok.Header["kid"] = "k1"
	s, err := tok.SignedString(j.Key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// HS256 signs claims with secret, with extra header fields hdr (may be nil).
func HS256(t testing.TB, secret []byte, claims jwt.MapClaims, hdr map[string]any) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	for k, v := range hdr {
		tok.Header[k] = v
	}
	s, err := tok.SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Unsigned is a token of claims with alg "none".
func Unsigned(claims jwt.MapClaims) string {
	enc := func(v any) string { b, _ := json.Marshal(v); return b64(b) }
	return enc(map[string]string{"alg": "none", "typ": "JWT"}) + "." + enc(claims) + "."
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
