package config

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse: it must never panic, every
// failure must be Problems wrapping ErrInvalid, and every config it accepts
// must build jobs that the jobs package accepts (registry and runner).
func FuzzParse(f *testing.F) {
	for _, path := range []string{examplePath, "testdata/broken.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"",
		"partitions: 4\n",
		"jobs: {a: {stages: [{name: x, exec: [\"true\"]}]}}\n",
		"jobs: {a: {stages: [{name: x, http: {url: \"http://h/p\", headers: {X-A: b}, timeout: 1s}}]}}\n",
		"jobs:\n  a: &j\n    stages: [&s {name: x, exec: [sh]}]\n  b: {<<: *j, retry: {backoff: 1s}}\n",
		"schedules: [{name: a, cron: \"@every 1m\", scope: backup, subjects: all}]\n",
		"redis: {url: \"rediss://u:p@h:1/2?dial_timeout=1s\"}\n",
		"redis: {addrs: [\"a:1\", \"b:2\"], masterName: m, poolSize: 100}\n",
		"runner: {leaseTTL: 100ms, concurrency: 1}\nhttp: {listen: \":0\"}\n",
		"a: &a [*a]\n",
		"jobs: &x {a: *x}\n",
		"token: ${HOME:-x}$${Y}\n",
		"--- \n...\n",
		"schedules: [{cron: \"TZ=\"}]",
		"jobs: {a: {debounce: 5s, debounceMax: 1m, stages: [{name: x, exec: [\"true\"]}]}}\n",
		"jobs: {a: {debounce: 2m, debounceMax: 1m, stages: [{name: x, exec: [\"true\"]}]}}\n",
		"jobs: {a: {debounce: -1s, stages: [{name: x, exec: [\"true\"]}]}}\n",
		"runner: {execStarts: 0}\n",
		"http: {token: a, readToken: b, maxSubjectStreams: 3, subjectTokens: {hmacSecret: 0123456789abcdef0123456789abcdef, issuer: i, audience: a, subjectClaim: uid}}\n",
		"http: {readToken: a, token: a, subjectTokens: {jwksURL: \"http://idp/jwks\", subjectClaim: exp}, maxSubjectStreams: 0}\n",
		"http: {subjectTokens: {hmacSecret: \"${TASKLEASE_APP_SECRET}\", audience: \"\"}}\n",
		"limiters: {remote_store: {concurrency: 50, rate: 20/s, burst: 10, holdOnRetryAfter: true}}\n" +
			"jobs: {a: {limiters: [remote_store], concurrency: 100, rate: 50/s, fairness: {groupBy: subjectPrefix, separator: \":\"}, stages: [{name: x, exec: [\"true\"]}]}}\n",
		"limiters: {l: {rate: 5/m}, m: {concurrency: 1}}\njobs: {a: {limiters: [l, m], fairness: {groupBy: request}, stages: [{name: x, exec: [\"true\"]}]}}\n",
		"limiters: {l: {rate: 1000000/s, burst: 1000000}}\njobs: {a: {rate: 3600000000/h, burst: 0, stages: [{name: x, exec: [\"true\"]}]}}\n",
		"limiters: {l: {burst: 3}, \"job.a\": {concurrency: -1}}\njobs: {a: {limiters: [l, l, x], fairness: {groupBy: request, separator: \"/\"}, stages: [{name: x, exec: [\"true\"]}]}}\n",
		"limiters: {l: }\njobs: {a: {concurrency: 100001, rate: 0/s, fairness: {}, stages: [{name: x, exec: [\"true\"]}]}}\n",
		"limiters: &l {r: {rate: 1/h}}\njobs: {a: {limiters: [r], concurrency: 1, fairness: {groupBy: subjectPrefix, separator: \"@\"}, stages: [{name: x, exec: [\"true\"]}]}}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			var ps Problems
			if !errors.Is(err, ErrInvalid) || !errors.As(err, &ps) || len(ps) == 0 {
				t.Fatalf("Parse error %T %v is not Problems/ErrInvalid", err, err)
			}
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty error text")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Validate after Parse: %v", err)
		}
		_ = c.RedisOptions()
		checkWithJobsPackage(t, c)
		for _, s := range c.Schedules {
			if _, err := ParseCron(s.Cron); err != nil {
				t.Fatalf("accepted schedule does not parse: %v", err)
			}
		}
	})
}
