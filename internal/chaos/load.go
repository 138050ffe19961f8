//go:build linux

// The load: requests through the runners' HTTP APIs, and the poller of the
// cron fan-out state.

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// seedSubjects submits one manual request for every bulk subject ("all"
// means subjects requested by anything but a schedule) and returns the
// Redis time once all are accepted. Accepted ones are recorded for check 6.
func (h *harness) seedSubjects() int64 {
	t := h.t
	work := make(chan string)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(h.seed), uint64(100+w)))
			for s := range work {
				deadline := time.Now().Add(20 * time.Second)
				for {
					var res jobs.SubmitResult
					sent := time.Now()
					_, err := h.post(h.url(rng)+taskPath(s, bulkScope)+"/runs", `{"source":"manual"}`, &res)
					if err == nil {
						h.acc.submit(taskkey.MustNew(s, bulkScope), sent, res)
						break
					}
					if time.Now().After(deadline) {
						failed.Add(1)
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	for _, s := range h.bulk {
		work <- s
	}
	close(work)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("chaos: %d bulk subjects could not be submitted within 20s", n)
	}
	now, err := redisNowMs(context.Background(), h.rdb)
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	return now
}

// load submits and cancels at random through random runners' APIs. The
// accepted submits and the cancels that cancelled or flagged a run are
// recorded for check 6.
func (h *harness) load(ctx context.Context, worker int) {
	rng := rand.New(rand.NewPCG(uint64(h.seed), uint64(10+worker)))
	policies := []string{"join", "join", "join", "queue", "queue", "replace"}
	for ctx.Err() == nil {
		base := h.url(rng)
		bulkSubj, syncSubj := h.bulk[rng.IntN(len(h.bulk))], h.syncs[rng.IntN(len(h.syncs))]
		var err error
		var res jobs.SubmitResult
		if rng.IntN(100) < limitedShare {
			err = h.loadLimited(base, rng, policies)
		} else {
			switch r := rng.IntN(100); {
			case r < 35, r >= 45 && r < 70:
				subj, scope := bulkSubj, bulkScope
				if r >= 45 {
					subj, scope = syncSubj, syncScope
				}
				src := []string{"manual", "manual", "foreground"}[rng.IntN(3)]
				sent := time.Now()
				_, err = h.post(base+taskPath(subj, scope)+"/runs",
					fmt.Sprintf(`{"source":%q,"policy":%q}`, src, policies[rng.IntN(len(policies))]), &res)
				if err == nil {
					h.acc.submit(taskkey.MustNew(subj, scope), sent, res)
					h.submits.Add(1)
					h.mu.Lock()
					h.outc[string(res.Outcome)]++
					h.mu.Unlock()
				}
			case r < 45, r >= 70 && r < 80:
				subj, scope := bulkSubj, bulkScope
				if r >= 70 {
					subj, scope = syncSubj, syncScope
				}
				_, err = h.post(base+"/v1/hooks/foreground", fmt.Sprintf(`{"subject":%q,"scopes":[%q]}`, subj, scope), nil)
				if err == nil {
					h.fgs.Add(1)
				}
			default:
				subj, scope := bulkSubj, bulkScope
				if r >= 90 {
					subj, scope = syncSubj, syncScope
				}
				var cres struct {
					Outcome jobs.CancelOutcome `json:"outcome"`
				}
				_, err = h.post(base+taskPath(subj, scope)+"/cancel", "", &cres)
				if err == nil {
					h.acc.cancel(taskkey.MustNew(subj, scope), cres.Outcome)
					h.cancels.Add(1)
				}
			}
		}
		if err != nil {
			h.errs.Add(1)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(20+rng.IntN(40)) * time.Millisecond):
		}
	}
}

// limitedShare is the percentage of the load's requests that go to the
// limited job: a modest share, enough to keep its limiter's slots busy
// (about 3 submits a second for runs that hold a slot about 2 s).
const limitedShare = 15

// loadLimited is one request of the load for the limited job: a submit
// (seven in ten), a foreground hook or a cancel, for a random subject.
func (h *harness) loadLimited(base string, rng *rand.Rand, policies []string) error {
	subj := h.limited[rng.IntN(len(h.limited))]
	switch r := rng.IntN(10); {
	case r < 7:
		var res jobs.SubmitResult
		src := []string{"manual", "manual", "foreground"}[rng.IntN(3)]
		sent := time.Now()
		_, err := h.post(base+taskPath(subj, limitedScope)+"/runs",
			fmt.Sprintf(`{"source":%q,"policy":%q}`, src, policies[rng.IntN(len(policies))]), &res)
		if err != nil {
			return err
		}
		h.acc.submit(taskkey.MustNew(subj, limitedScope), sent, res)
		h.submits.Add(1)
		h.mu.Lock()
		h.outc[string(res.Outcome)]++
		h.mu.Unlock()
	case r < 8:
		if _, err := h.post(base+"/v1/hooks/foreground", fmt.Sprintf(`{"subject":%q,"scopes":[%q]}`, subj, limitedScope), nil); err != nil {
			return err
		}
		h.fgs.Add(1)
	default:
		var cres struct {
			Outcome jobs.CancelOutcome `json:"outcome"`
		}
		if _, err := h.post(base+taskPath(subj, limitedScope)+"/cancel", "", &cres); err != nil {
			return err
		}
		h.acc.cancel(taskkey.MustNew(subj, limitedScope), cres.Outcome)
		h.cancels.Add(1)
	}
	return nil
}

// pollState records the cron fan-out state of each occurrence (its claim
// and finish times bound the occurrence's requests): the current one as it
// goes, the earlier ones as the claims archived them.
func (h *harness) pollState(ctx context.Context) {
	for ctx.Err() == nil {
		h.stMu.Lock()
		ep := len(h.states) - 1
		h.stMu.Unlock()
		if sts, err := h.readOccStates(ctx); err == nil {
			h.stMu.Lock()
			if ep == len(h.states)-1 {
				maps.Copy(h.states[ep], sts)
			}
			h.stMu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// taskPath is a task's route in the runners' API (docs/http-api.md).
func taskPath(subject, scope string) string {
	return "/v1/tasks/" + url.PathEscape(subject) + "/" + url.PathEscape(scope)
}

// post POSTs a JSON body and decodes a 200 answer into out. h.http has a
// timeout: a stopped runner must not hang the load or the checker.
func (h *harness) post(url, body string, out any) (int, error) {
	resp, err := h.http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, fmt.Errorf("POST %s: %s: %s", url, resp.Status, strings.TrimSpace(b.String()))
	}
	if out == nil {
		return resp.StatusCode, nil
	}
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(out)
}

// get GETs url into out (only on 200) and returns the status.
func (h *harness) get(url string, out any) (int, error) {
	resp, err := h.http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && out != nil {
		return resp.StatusCode, json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode, nil
}
