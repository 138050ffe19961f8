package deploy_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
)

// describer records what a Registry registers: each metric's name and the
// label names its series carry.
type describer struct{ labels map[string][]string }

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}`)

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		m := descRE.FindStringSubmatch(desc.String())
		if m == nil {
			return fmt.Errorf("cannot read %s", desc)
		}
		var names []string
		for _, kv := range strings.Split(m[2], ",") {
			if k, _, ok := strings.Cut(kv, "="); ok {
				names = append(names, k)
			}
		}
		for _, v := range strings.Split(m[3], ",") {
			if v != "" {
				names = append(names, v)
			}
		}
		d.labels[m[1]] = append(d.labels[m[1]], names...)
	}
	return nil
}
func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}
func (d *describer) Unregister(prometheus.Collector) bool { return false }

// The alert rules use only metrics the runner exports, with their labels,
// and each rule is complete: a severity, a summary, a hold time.
func TestAlertRules(t *testing.T) {
	d := &describer{labels: map[string][]string{}}
	mini := redistest.StartMini(t)
	if _, err := jobs.NewRegistry(mini.Client(t), jobs.Config{Metrics: d,
		Jobs: []jobs.Job{{Scope: "s", Stages: []jobs.Stage{{Name: "a", Handler: jobs.HandlerFunc(nil)}}}}}); err != nil {
		t.Fatal(err)
	}
	if len(d.labels) < 5 {
		t.Fatalf("the registry registered %d metrics: %v", len(d.labels), d.labels)
	}
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	readYAML(t, "prometheus/alerts.yaml", &rules)
	if len(rules.Groups) == 0 || len(rules.Groups[0].Rules) < 5 {
		t.Fatalf("want a group of alert rules, got %+v", rules)
	}
	metricRE := regexp.MustCompile(`\b(tasklease_[a-z_]+)(\{[^}]*\})?`)
	labelRE := regexp.MustCompile(`([a-z_]+)\s*(=|!=|=~|!~)\s*"`)
	byRE := regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
	seen := map[string]bool{}
	for _, r := range rules.Groups[0].Rules {
		name := r.Alert
		if name == "" || seen[name] {
			t.Errorf("rule %q: missing or repeated alert name", name)
		}
		seen[name] = true
		if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
			t.Errorf("%s: for %q", name, r.For)
		}
		if !slices.Contains([]string{"warning", "critical"}, r.Labels["severity"]) {
			t.Errorf("%s: severity %q", name, r.Labels["severity"])
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: wants a summary and a description", name)
		}
		if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") {
			t.Errorf("%s: unbalanced parentheses in %s", name, r.Expr)
		}
		// every label a series of the expression's metrics can carry
		have := map[string]bool{"instance": true, "job": true}
		uses := metricRE.FindAllStringSubmatch(r.Expr, -1)
		if len(uses) == 0 {
			t.Errorf("%s: uses no tasklease metric: %s", name, r.Expr)
		}
		for _, u := range uses {
			metric := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(u[1], "_bucket"), "_sum"), "_count")
			labels, ok := d.labels[metric]
			if !ok {
				t.Errorf("%s: the runner exports no %s", name, u[1])
				continue
			}
			for _, l := range labels {
				have[l] = true
			}
			for _, m := range labelRE.FindAllStringSubmatch(u[2], -1) {
				if !slices.Contains(labels, m[1]) {
					t.Errorf("%s: %s has no label %q (it has %v)", name, metric, m[1], labels)
				}
			}
		}
		for _, m := range byRE.FindAllStringSubmatch(r.Expr, -1) {
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); !have[l] {
					t.Errorf("%s: aggregates by %q, which none of its metrics has", name, l)
				}
			}
		}
		for _, text := range r.Annotations {
			for _, m := range regexp.MustCompile(`\$labels\.([a-z_]+)`).FindAllStringSubmatch(text, -1) {
				if !have[m[1]] {
					t.Errorf("%s: an annotation uses label %q, which none of its metrics has", name, m[1])
				}
			}
		}
	}
}
