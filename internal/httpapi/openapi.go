package httpapi

import (
	_ "embed"
	"net/http"
)

// openapiJSON is the OpenAPI 3.0.3 document of the API (docs/http-api.md), written
// by hand. openapi_test.go validates it, checks that it lists exactly the
// routes registered in newAPI, and validates every response the package's
// tests receive against it, so a handler change that alters the wire shape
// fails the tests until the document follows.
//
//go:embed openapi.json
var openapiJSON []byte

// openapi serves GET /v1/openapi.json: the embedded document, byte for byte.
// It is a /v1 route like the others, so the token and browser rules apply.
func (a *api) openapi(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openapiJSON)
}
