package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/tasklease/tasklease/internal/apptoken"
	"github.com/tasklease/tasklease/internal/config"
)

// appSecretEnv holds the HS256 secret when no config file names one.
const appSecretEnv = "TASKLEASE_APP_SECRET"

// cmdToken mints a subject token (docs/app-access.md) from
// http.subjectTokens.hmacSecret of --config, or TASKLEASE_APP_SECRET,
// and prints it. The issuer, audience and subject claim come from the
// config too, so the runner it configures accepts the token.
func cmdToken(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file whose http.subjectTokens to use (default: TASKLEASE_APP_SECRET, no issuer or audience)")
	subject := fs.String("subject", "", "the subject the token opens (required)")
	ttl := fs.Duration("ttl", 15*time.Minute, "how long the token is valid")
	scopes := fs.String("scopes", "", "comma-separated jobs the token may touch (default: all)")
	actions := fs.String("actions", "", "comma-separated actions: read, submit, cancel (default: all)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fail(exitUsage, "token takes no arguments (got %q); use --subject", pos[0])
	}
	if *subject == "" {
		return fail(exitUsage, "token needs --subject SUBJECT")
	}
	var st config.SubjectTokens
	if *cfgPath != "" {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			return fail(exitUsage, "%w", err)
		}
		st = cfg.HTTP.SubjectTokens
	}
	secret := st.HMACSecret
	if secret == "" {
		secret = os.Getenv(appSecretEnv)
	}
	if secret == "" {
		return fail(exitUsage, "no secret: set http.subjectTokens.hmacSecret in --config, or %s", appSecretEnv)
	}
	tok, err := apptoken.Mint(secret, apptoken.MintOptions{
		Subject: *subject, TTL: *ttl, Scopes: apptoken.SplitList(*scopes), Actions: apptoken.SplitList(*actions),
		Issuer: st.Issuer, Audience: st.Audience, SubjectClaim: st.SubjectClaim,
	})
	if err != nil {
		return &exitError{code: exitUsage, err: errors.New("token: " + err.Error())}
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
