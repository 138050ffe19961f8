package apptoken

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tasklease/tasklease/internal/apptoken/apptokentest"
)

const testSecret = "0123456789abcdef0123456789abcdef-test"

func TestVerify(t *testing.T) {
	j := apptokentest.NewJWKS(t)
	v, err := NewVerifier(t.Context(), Config{HMACSecret: testSecret, JWKSURL: j.URL, Issuer: "https://idp.test/", Audience: "tasklease"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ok := func() jwt.MapClaims {
		return jwt.MapClaims{"sub": "u42", "exp": now.Add(time.Minute).Unix(), "iss": "https://idp.test/", "aud": "tasklease"}
	}
	with := func(k string, val any) jwt.MapClaims {
		c := ok()
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	cases := []struct {
		name, token, refusal string
	}{
		{"hs256", apptokentest.HS256(t, []byte(testSecret), ok(), nil), ""},
		{"jwks es256", j.Sign(t, ok()), ""},
		{"hs256 signed with the JWKS public key", apptokentest.HS256(t, j.PublicDER, ok(), map[string]any{"kid": "k1"}), "bad signature or algorithm"},
		{"alg none", apptokentest.Unsigned(ok()), "bad signature or algorithm"},
		{"wrong secret", apptokentest.HS256(t, []byte(strings.Repeat("x", 40)), ok(), nil), "bad signature or algorithm"},
		{"exp missing", apptokentest.HS256(t, []byte(testSecret), with("exp", nil), nil), "exp missing"},
		{"exp 0", apptokentest.HS256(t, []byte(testSecret), with("exp", 0), nil), "expired"},
		{"expired", apptokentest.HS256(t, []byte(testSecret), with("exp", now.Add(-time.Minute).Unix()), nil), "expired"},
		{"expired within leeway", apptokentest.HS256(t, []byte(testSecret), with("exp", now.Add(-Leeway/2).Unix()), nil), ""},
		{"nbf future", apptokentest.HS256(t, []byte(testSecret), with("nbf", now.Add(time.Minute).Unix()), nil), "not valid yet (nbf)"},
		{"wrong audience", apptokentest.HS256(t, []byte(testSecret), with("aud", "other"), nil), "wrong audience"},
		{"no audience", apptokentest.HS256(t, []byte(testSecret), with("aud", nil), nil), "aud missing"},
		{"wrong issuer", j.Sign(t, with("iss", "https://evil.test/")), "wrong issuer"},
		{"no subject", apptokentest.HS256(t, []byte(testSecret), with("sub", nil), nil), `no subject in claim "sub"`},
		{"subject with |", apptokentest.HS256(t, []byte(testSecret), with("sub", "u42|course_sync"), nil), `claim "sub" is not a valid subject`},
		{"subject with /", apptokentest.HS256(t, []byte(testSecret), with("sub", "u4/2"), nil), `claim "sub" is not a valid subject`},
		{"garbage", "not.a.jwt", "malformed"},
		{"too long", strings.Repeat("a", MaxLen+1), "longer than 8192 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, err := v.Verify(tc.token)
			if tc.refusal == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if g.Subject != "u42" || g.Scopes != nil || g.Actions != nil {
					t.Fatalf("grant %+v", g)
				}
				return
			}
			r, isRefusal := err.(*Refusal)
			if !isRefusal || r.Reason != tc.refusal {
				t.Fatalf("err %v, want refusal %q", err, tc.refusal)
			}
			if strings.Contains(err.Error(), tc.token) {
				t.Fatalf("error quotes the token")
			}
		})
	}
}

func TestVerifyJWKSOnlyRefusesHS256(t *testing.T) {
	j := apptokentest.NewJWKS(t)
	v, err := NewVerifier(t.Context(), Config{JWKSURL: j.URL, Audience: "tasklease"})
	if err != nil {
		t.Fatal(err)
	}
	c := jwt.MapClaims{"sub": "u42", "exp": time.Now().Add(time.Minute).Unix(), "aud": "tasklease"}
	if _, err := v.Verify(apptokentest.HS256(t, j.PublicDER, c, map[string]any{"kid": "k1"})); err == nil {
		t.Fatal("HS256 token signed with the JWKS public key accepted")
	}
	if _, err := v.Verify(j.Sign(t, c)); err != nil {
		t.Fatal(err)
	}
}

func TestMintVerifyClaims(t *testing.T) {
	v, err := NewVerifier(context.Background(), Config{HMACSecret: testSecret, SubjectClaim: "user_id"})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Mint(testSecret, MintOptions{Subject: "u42", TTL: 15 * time.Minute, Scopes: []string{"course_sync"},
		Actions: []string{"read", "submit"}, SubjectClaim: "user_id"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if g.Subject != "u42" || !g.AllowsScope("course_sync") || g.AllowsScope("backup") ||
		!g.Allows(ActionSubmit) || g.Allows(ActionCancel) || time.Until(g.Expires) > 15*time.Minute {
		t.Fatalf("grant %+v", g)
	}
	// An empty list grants nothing; an unknown action grants nothing.
	g, err = v.Verify(apptokentest.HS256(t, []byte(testSecret), jwt.MapClaims{"user_id": "u42", "exp": time.Now().Add(time.Minute).Unix(),
		ClaimScopes: []string{}, ClaimActions: []string{"admin"}}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if g.AllowsScope("course_sync") || g.Allows(ActionRead) {
		t.Fatalf("empty lists grant %+v", g)
	}
	// sub is not the subject claim here.
	if _, err := v.Verify(apptokentest.HS256(t, []byte(testSecret), jwt.MapClaims{"sub": "u42", "exp": time.Now().Add(time.Minute).Unix()}, nil)); err == nil {
		t.Fatal("token without user_id accepted")
	}
}
