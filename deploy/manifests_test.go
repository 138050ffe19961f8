// Package deploy holds what users run tasklease with: Kubernetes manifests
// (deploy/kubernetes), and the tests that keep them, the Dockerfile and
// docker-compose.yml consistent with the code. There is no Docker engine
// or cluster here: the tests parse the files and check them against the
// runner's flags, routes, config and shutdown timing.
package deploy_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tasklease/tasklease/internal/config"
)

// handBackBound bounds the hand-back of unfinished runs after the grace
// (jobs handBackTimeout and the finish of each run).
const handBackBound = 5 * time.Second

func readYAML(t *testing.T, path string, out any) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name      string `yaml:"name"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
			SecretKeyRef *struct{ Name, Key string } `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe probe `yaml:"readinessProbe"`
	LivenessProbe  probe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop struct {
			Exec struct{ Command []string } `yaml:"exec"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

type deployment struct {
	Kind string `yaml:"kind"`
	Spec struct {
		Replicas int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
					RunAsUser    int  `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
				Volumes    []struct {
					Name      string                 `yaml:"name"`
					ConfigMap *struct{ Name string } `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// flagValue returns the value after name in args.
func flagValue(args []string, name string) string {
	if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// serveFlags are the flags `runner serve` defines (cmd/runner/serve.go).
func serveFlags(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("../cmd/runner/serve.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`fs\.(?:String|Bool|Duration|Int)\("([a-z-]+)"`).FindAllSubmatch(src, -1) {
		out = append(out, "--"+string(m[1]))
	}
	return out
}

// checkServeArgs checks a container's command line against the runner.
func checkServeArgs(t *testing.T, where string, args []string) (configPath string, port int) {
	t.Helper()
	flags := serveFlags(t)
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("%s: args %v, want serve …", where, args)
	}
	for _, a := range args[1:] {
		if strings.HasPrefix(a, "--") && !slices.Contains(flags, a) {
			t.Errorf("%s: runner serve has no flag %s (it has %v)", where, a, flags)
		}
	}
	listen := flagValue(args, "--listen")
	host, p, ok := strings.Cut(listen, ":")
	if !ok || host != "0.0.0.0" {
		t.Errorf("%s: --listen %q, want 0.0.0.0:<port> (127.0.0.1 is unreachable from outside the container)", where, listen)
	}
	port, _ = strconv.Atoi(p)
	return flagValue(args, "--config"), port
}

func TestKubernetesManifests(t *testing.T) {
	dir := "kubernetes"
	var kust struct {
		Resources          []string `yaml:"resources"`
		ConfigMapGenerator []struct {
			Name  string   `yaml:"name"`
			Files []string `yaml:"files"`
		} `yaml:"configMapGenerator"`
		Images []struct{ Name string } `yaml:"images"`
	}
	readYAML(t, filepath.Join(dir, "kustomization.yaml"), &kust)
	for _, want := range []string{"deployment.yaml", "service.yaml", "pdb.yaml"} {
		if !slices.Contains(kust.Resources, want) {
			t.Errorf("kustomization lacks %s", want)
		}
	}
	// The ConfigMap is config.example.yaml, and it is a valid config.
	if len(kust.ConfigMapGenerator) != 1 || !slices.Equal(kust.ConfigMapGenerator[0].Files, []string{"config.yaml"}) {
		t.Fatalf("configMapGenerator: %+v", kust.ConfigMapGenerator)
	}
	cmName := kust.ConfigMapGenerator[0].Name
	cfgText, _ := os.ReadFile(filepath.Join(dir, "config.yaml"))
	example, _ := os.ReadFile("../config.example.yaml")
	if !bytes.Equal(cfgText, example) {
		t.Errorf("deploy/kubernetes/config.yaml differs from config.example.yaml: cp config.example.yaml deploy/kubernetes/config.yaml")
	}
	t.Setenv("TASKLEASE_TOKEN", "t")
	cfg, err := config.Parse(cfgText)
	if err != nil {
		t.Fatalf("the ConfigMap's config: %v", err)
	}

	var d deployment
	readYAML(t, filepath.Join(dir, "deployment.yaml"), &d)
	spec := d.Spec.Template.Spec
	if d.Kind != "Deployment" || d.Spec.Replicas != 3 || len(spec.Containers) != 1 {
		t.Fatalf("deployment: kind %s, %d replicas, %d containers; want a Deployment of 3 with one container", d.Kind, d.Spec.Replicas, len(spec.Containers))
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod labels %v", k, v, d.Spec.Template.Metadata.Labels)
		}
	}
	c := spec.Containers[0]
	if len(kust.Images) != 1 || c.Image != kust.Images[0].Name {
		t.Errorf("image %q is not the kustomization's image %+v", c.Image, kust.Images)
	}
	cfgPath, port := checkServeArgs(t, "deployment", c.Args)
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != port || c.Ports[0].Name != "http" {
		t.Errorf("ports %+v, want http: %d (the --listen port)", c.Ports, port)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.Name == "config" && filepath.Join(m.MountPath, "config.yaml") == cfgPath {
			mounted = true
		}
	}
	for _, v := range spec.Volumes {
		if v.Name == "config" && (v.ConfigMap == nil || v.ConfigMap.Name != cmName) {
			t.Errorf("volume config is not the ConfigMap %s", cmName)
		}
	}
	if !mounted {
		t.Errorf("--config %s is not the mounted ConfigMap's config.yaml", cfgPath)
	}
	// Probes: the runner's routes (internal/httpapi), on the http port.
	routes, err := os.ReadFile("../internal/httpapi/httpapi.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path} {
		if !bytes.Contains(routes, []byte(`"GET `+p+`"`)) {
			t.Errorf("probe path %s is no route of internal/httpapi", p)
		}
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.ReadinessProbe.HTTPGet.Port != "http" || c.LivenessProbe.HTTPGet.Port != "http" {
		t.Errorf("probes: readiness %+v liveness %+v, want /readyz and /healthz on http", c.ReadinessProbe, c.LivenessProbe)
	}
	// Shutdown: preStop, then the grace, then the hand-back, within the
	// termination grace period.
	pre := 0
	if cmd := c.Lifecycle.PreStop.Exec.Command; len(cmd) == 2 && cmd[0] == "sleep" {
		pre, _ = strconv.Atoi(cmd[1])
	} else {
		t.Errorf("preStop %v, want [sleep N]", cmd)
	}
	need := time.Duration(pre)*time.Second + cfg.Runner.ShutdownGrace.D() + handBackBound
	if got := time.Duration(spec.TerminationGracePeriodSeconds) * time.Second; got <= need {
		t.Errorf("terminationGracePeriodSeconds %s, want more than preStop + shutdownGrace + hand-back = %s", got, need)
	}
	// Non-root, read-only root filesystem, as the image's user.
	if !spec.SecurityContext.RunAsNonRoot || spec.SecurityContext.RunAsUser != dockerUser(t) ||
		!c.SecurityContext.ReadOnlyRootFilesystem || c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("security: %+v %+v, want non-root as the Dockerfile's user, read-only root, no privilege escalation", spec.SecurityContext, c.SecurityContext)
	}
	// Every variable the config needs (${VAR} without a default) is set.
	env := map[string]bool{}
	for _, e := range c.Env {
		env[e.Name] = true
	}
	for _, v := range requiredEnv(string(cfgText)) {
		if !env[v] {
			t.Errorf("the config needs ${%s}, which the deployment does not set", v)
		}
	}
	for _, v := range []string{"TASKLEASE_RUNNER_ID", "TASKLEASE_REDIS_URL"} {
		if !env[v] {
			t.Errorf("deployment does not set %s", v)
		}
	}

	var svc struct {
		Spec struct {
			Selector map[string]string `yaml:"selector"`
			Ports    []struct {
				TargetPort string `yaml:"targetPort"`
			} `yaml:"ports"`
		} `yaml:"spec"`
	}
	readYAML(t, filepath.Join(dir, "service.yaml"), &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != "http" {
		t.Errorf("service ports %+v, want targetPort http", svc.Spec.Ports)
	}
	var pdb struct {
		Kind string `yaml:"kind"`
		Spec struct {
			MaxUnavailable int `yaml:"maxUnavailable"`
			Selector       struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		} `yaml:"spec"`
	}
	readYAML(t, filepath.Join(dir, "pdb.yaml"), &pdb)
	for name, sel := range map[string]map[string]string{"service": svc.Spec.Selector, "pdb": pdb.Spec.Selector.MatchLabels} {
		if len(sel) == 0 {
			t.Errorf("%s has no selector", name)
		}
		for k, v := range sel {
			if d.Spec.Template.Metadata.Labels[k] != v {
				t.Errorf("%s selector %s=%s matches no runner pod", name, k, v)
			}
		}
	}
	if pdb.Kind != "PodDisruptionBudget" || pdb.Spec.MaxUnavailable != 1 {
		t.Errorf("pdb: %+v", pdb)
	}
}

// requiredEnv lists the ${VAR} references of a config without a default,
// outside comments (an unset one would expand to "").
func requiredEnv(text string) []string {
	var out []string
	uncommented := regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(text, "")
	for _, m := range regexp.MustCompile(`\$\{([A-Z0-9_]+)\}`).FindAllStringSubmatch(uncommented, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

// dockerUser is the uid of the Dockerfile's USER.
func dockerUser(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER (\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Dockerfile has no numeric USER")
	}
	uid, _ := strconv.Atoi(string(m[1]))
	return uid
}

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if strings.Count(s, "\nFROM ") < 1 || !strings.Contains(s, " AS build") || !strings.Contains(s, "COPY --from=build") {
		t.Error("Dockerfile: want a multi-stage build")
	}
	if !strings.Contains(s, "CGO_ENABLED=0") {
		t.Error("Dockerfile: want a static binary (CGO_ENABLED=0)")
	}
	if uid := dockerUser(t); uid == 0 {
		t.Error("Dockerfile: runs as root")
	}
	var cmd []string
	if m := regexp.MustCompile(`(?m)^CMD (\[.*\])$`).FindStringSubmatch(s); m != nil {
		_ = yaml.Unmarshal([]byte(m[1]), &cmd)
	}
	cfgPath, port := checkServeArgs(t, "Dockerfile CMD", cmd)
	if !strings.Contains(s, "COPY config.example.yaml "+cfgPath) {
		t.Errorf("Dockerfile: --config %s is not where config.example.yaml is copied", cfgPath)
	}
	if !strings.Contains(s, "EXPOSE "+strconv.Itoa(port)) {
		t.Errorf("Dockerfile: EXPOSE is not the --listen port %d", port)
	}
}

func TestDockerCompose(t *testing.T) {
	var dc struct {
		Services map[string]struct {
			Image           string            `yaml:"image"`
			Build           string            `yaml:"build"`
			Command         []string          `yaml:"command"`
			Environment     map[string]string `yaml:"environment"`
			Ports           []string          `yaml:"ports"`
			StopGracePeriod string            `yaml:"stop_grace_period"`
			Entrypoint      []string          `yaml:"entrypoint"`
			Volumes         []string          `yaml:"volumes"`
		} `yaml:"services"`
	}
	readYAML(t, "../docker-compose.yml", &dc)
	// The fence-guarded demo downstream, and the runners' config that
	// pushes to it.
	ds, ok := dc.Services["downstream"]
	if !ok || !slices.Equal(ds.Entrypoint, []string{"fencedemo"}) {
		t.Fatalf("docker-compose: want a downstream service running fencedemo, got %+v", ds)
	}
	dsListen := flagValue(ds.Command, "--listen")
	if _, err := os.Stat("../cmd/fencedemo/main.go"); err != nil || !strings.HasPrefix(dsListen, "0.0.0.0:") {
		t.Errorf("downstream: --listen %q (want 0.0.0.0:<port>), cmd/fencedemo: %v", dsListen, err)
	}
	dockerfile, _ := os.ReadFile("../Dockerfile")
	if !bytes.Contains(dockerfile, []byte("./cmd/fencedemo")) {
		t.Error("the Dockerfile does not build cmd/fencedemo, which the downstream service runs")
	}
	if s, ok := dc.Services["redis"]; !ok || !strings.HasPrefix(s.Image, "redis:") {
		t.Error("docker-compose: want a redis service")
	}
	example, _ := os.ReadFile("../config.example.yaml")
	t.Setenv("TASKLEASE_TOKEN", "t")
	cfg, err := config.Parse(example)
	if err != nil {
		t.Fatal(err)
	}
	var runners []string
	for name, s := range dc.Services {
		if !strings.HasPrefix(name, "runner-") {
			continue
		}
		runners = append(runners, name)
		cfgPath, port := checkServeArgs(t, name, s.Command)
		var mounted string
		for _, v := range s.Volumes {
			if src, dst, _ := strings.Cut(strings.TrimSuffix(v, ":ro"), ":"); dst == cfgPath {
				mounted = src
			}
		}
		if mounted == "" {
			t.Fatalf("%s: --config %s is not a mounted file (volumes %v)", name, cfgPath, s.Volumes)
		}
		text, err := os.ReadFile(filepath.Join("..", mounted))
		if err != nil {
			t.Fatal(err)
		}
		rc, err := config.Parse(text)
		if err != nil {
			t.Fatalf("%s: its config %s: %v", name, mounted, err)
		}
		// (config.Parse expanded ${TASKLEASE_DOWNSTREAM:-…} to its default:
		// the README's walkthrough sets it to run the same config outside Docker)
		wantURL := "http://downstream:" + strings.TrimPrefix(dsListen, "0.0.0.0:") + "/push"
		pushes := false
		for _, j := range rc.Jobs {
			for _, st := range j.Stages {
				pushes = pushes || st.HTTP != nil && st.HTTP.URL == wantURL
			}
		}
		if !pushes {
			t.Errorf("%s: %s has no http stage pushing to the downstream service (%s)", name, mounted, wantURL)
		}
		cfg = rc
		if flagValue(s.Command, "--redis") != "redis://redis:6379/0" {
			t.Errorf("%s: --redis %q, want the compose redis service", name, flagValue(s.Command, "--redis"))
		}
		if len(s.Ports) != 1 || !strings.HasSuffix(s.Ports[0], ":"+strconv.Itoa(port)) {
			t.Errorf("%s: ports %v, want one mapping to %d", name, s.Ports, port)
		}
		if s.Environment["TASKLEASE_RUNNER_ID"] != name || s.Environment["TASKLEASE_TOKEN"] == "" {
			t.Errorf("%s: environment %v, want TASKLEASE_RUNNER_ID=%s and a token", name, s.Environment, name)
		}
		if g, err := time.ParseDuration(s.StopGracePeriod); err != nil || g <= cfg.Runner.ShutdownGrace.D()+handBackBound {
			t.Errorf("%s: stop_grace_period %q, want more than shutdownGrace + hand-back", name, s.StopGracePeriod)
		}
	}
	slices.Sort(runners)
	if !slices.Equal(runners, []string{"runner-a", "runner-b", "runner-c"}) {
		t.Errorf("runners %v, want runner-a, runner-b, runner-c", runners)
	}
}
