package daemon

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/config"
)

// The container image's files. Paths in the Dockerfile's COPY sources are
// relative to the build context, the repository root.
const (
	dockerfilePath   = "../../deploy/Dockerfile"
	dockerignorePath = "../../.dockerignore"
	buildContext     = "../.."
	// curveSecretDir is where the image's config and the pod read the CURVE
	// keys, mounted from outside (deploy/README.md).
	curveSecretDir = "/run/secrets/ingestor-curve"
)

// dockerInstruction is one instruction of a Dockerfile.
type dockerInstruction struct {
	line  int    // of its first line
	cmd   string // upper case: FROM, RUN, COPY, ...
	args  string // the rest, continuation lines joined
	stage int    // index of the FROM it follows
}

// parseDockerfile splits a Dockerfile into instructions: comment lines
// dropped, lines ending in a backslash joined with the next.
func parseDockerfile(t *testing.T, file string) []dockerInstruction {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var (
		out   []dockerInstruction
		cur   *dockerInstruction
		stage = -1
	)
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur == nil {
			cmd, args, _ := strings.Cut(trimmed, " ")
			cmd = strings.ToUpper(cmd)
			if cmd == "FROM" {
				stage++
			}
			cur = &dockerInstruction{line: i + 1, cmd: cmd, stage: stage}
			trimmed = args
		}
		body, more := strings.CutSuffix(trimmed, "\\")
		cur.args = strings.TrimSpace(cur.args + " " + strings.TrimSpace(body))
		if !more {
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: the last instruction ends with a backslash", file, cur.line)
	}
	return out
}

// words splits a Dockerfile argument list: a JSON array (exec form) or
// words separated by spaces.
func (in dockerInstruction) words(t *testing.T) []string {
	t.Helper()
	if strings.HasPrefix(in.args, "[") {
		var w []string
		if err := json.Unmarshal([]byte(in.args), &w); err != nil {
			t.Fatalf("Dockerfile:%d: %s %s: %v", in.line, in.cmd, in.args, err)
		}
		return w
	}
	return strings.Fields(in.args)
}

// TestDeployDockerfile checks what can be checked of deploy/Dockerfile
// without Docker: a cgo build stage and a slim runtime stage with libzmq;
// every COPY from the build context names a path that exists and that
// .dockerignore keeps; the config the image runs is the one it copies, and
// it validates with no environment (plain `docker run`) once the CURVE keys
// are mounted; the image exposes exactly that config's ports, declares its
// data_dir a volume, checks the health on its http_addr, and runs as a
// numeric non-root user.
func TestDeployDockerfile(t *testing.T) {
	img := readDockerImage(t)
	img.checkStages(t)
	copied := img.checkCopies(t)
	cfg := img.runConfig(t, copied)
	checkContainerConfig(t, cfg)
	img.checkPortsAndVolume(t, cfg)
	img.checkHealthcheck(t, cfg)

	uid, gid := dockerfileUser(t)
	if uid == 0 || gid == 0 {
		t.Errorf("the image runs as %d:%d, want a non-root user and group", uid, gid)
	}
}

// dockerImage is deploy/Dockerfile's instructions by command, and the
// index of its last stage, the runtime one.
type dockerImage struct {
	byCmd   map[string][]dockerInstruction
	runtime int
}

// readDockerImage parses deploy/Dockerfile, failing unless it has a build
// stage and a runtime stage.
func readDockerImage(t *testing.T) *dockerImage {
	t.Helper()
	ins := parseDockerfile(t, dockerfilePath)
	byCmd := map[string][]dockerInstruction{}
	for _, in := range ins {
		byCmd[in.cmd] = append(byCmd[in.cmd], in)
	}
	froms := byCmd["FROM"]
	if len(froms) < 2 {
		t.Fatalf("want a build stage and a runtime stage, have %d FROM", len(froms))
	}
	return &dockerImage{byCmd: byCmd, runtime: len(froms) - 1}
}

// stageRuns returns the arguments of the RUN instructions of stage, one a
// line.
func (img *dockerImage) stageRuns(stage int) string {
	var b strings.Builder
	for _, in := range img.byCmd["RUN"] {
		if in.stage == stage {
			b.WriteString(in.args + "\n")
		}
	}
	return b.String()
}

// checkStages checks that the build stage has what a cgo build of the
// binaries needs, and that the runtime stage is slim and installs libzmq.
func (img *dockerImage) checkStages(t *testing.T) {
	t.Helper()
	build := img.stageRuns(0)
	for _, want := range []string{"libzmq3-dev", "pkg-config", "CGO_ENABLED=1", "./cmd/ingestor", "./cmd/processor",
		"internal/buildinfo.revision=${VCS_REVISION}"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build stage does not mention %s", want)
		}
	}
	for _, want := range []string{"libzmq5", "ca-certificates"} {
		if !strings.Contains(img.stageRuns(img.runtime), want) {
			t.Errorf("the runtime stage does not install %s", want)
		}
	}
	if froms := img.byCmd["FROM"]; !strings.Contains(froms[img.runtime].args, "-slim") {
		t.Errorf("the runtime stage is FROM %s, want a slim image", froms[img.runtime].args)
	}
}

// checkCopies checks that every COPY from the build context names paths
// that exist and that .dockerignore keeps, as it keeps what the build
// compiles, and returns the files the runtime stage copies: destination
// to path in the context.
func (img *dockerImage) checkCopies(t *testing.T) (copied map[string]string) {
	t.Helper()
	// COPY from the build context: the sources exist and are not ignored.
	ignored := dockerignorePatterns(t)
	copied = map[string]string{} // runtime destination file -> context path
	for _, in := range img.byCmd["COPY"] {
		w := in.words(t)
		fromStage := slices.ContainsFunc(w, func(s string) bool { return strings.HasPrefix(s, "--from=") })
		w = slices.DeleteFunc(w, func(s string) bool { return strings.HasPrefix(s, "--") })
		if len(w) < 2 {
			t.Errorf("Dockerfile:%d: COPY %s: want sources and a destination", in.line, in.args)
			continue
		}
		if fromStage {
			continue
		}
		srcs, dest := w[:len(w)-1], w[len(w)-1]
		for _, src := range srcs {
			if _, err := os.Stat(filepath.Join(buildContext, src)); err != nil {
				t.Errorf("Dockerfile:%d: COPY %s: %v", in.line, src, err)
			}
			if p := ignoredBy(t, ignored, src); p != "" {
				t.Errorf("Dockerfile:%d: COPY %s, which .dockerignore excludes (%q)", in.line, src, p)
			}
			if in.stage == img.runtime && !strings.HasSuffix(dest, "/") {
				copied[dest] = src
			}
		}
	}
	// What the build compiles is in the context too.
	for _, p := range []string{"go.mod", "go.sum", "cmd/ingestor", "cmd/processor", "config/ingestor.example.toml"} {
		if pat := ignoredBy(t, ignored, p); pat != "" {
			t.Errorf(".dockerignore excludes %s (%q), which the build needs", p, pat)
		}
	}
	return copied
}

// runConfig returns the config the image runs, `ingestor run -c FILE`, which
// one of the copied files must be, parsed with no environment and with the
// CURVE keys mounted.
func (img *dockerImage) runConfig(t *testing.T, copied map[string]string) *config.Config {
	t.Helper()
	var entry, cmd []string
	if e := img.byCmd["ENTRYPOINT"]; len(e) > 0 {
		entry = e[len(e)-1].words(t)
	}
	if c := img.byCmd["CMD"]; len(c) > 0 {
		cmd = c[len(c)-1].words(t)
	}
	if !slices.Equal(entry, []string{"ingestor"}) || len(cmd) == 0 || cmd[0] != "run" {
		t.Fatalf("ENTRYPOINT %q CMD %q: want ingestor run -c FILE in exec form", entry, cmd)
	}
	cfgPath := flagValue(cmd, "-c")
	src, ok := copied[cfgPath]
	if !ok {
		t.Fatalf("the image runs the config %q, which no COPY of the runtime stage puts there", cfgPath)
	}
	toml, err := os.ReadFile(filepath.Join(buildContext, src))
	if err != nil {
		t.Fatal(err)
	}
	data := strings.ReplaceAll(string(toml), curveSecretDir+"/", curveKeysDir(t)+"/")
	cfg, err := config.ParseWithEnv(src, []byte(data), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("the image's config, with no environment and CURVE keys at %s:\n%v", curveSecretDir, err)
	}
	return cfg
}

// checkPortsAndVolume checks that the image exposes exactly the ports cfg
// listens on, declares its data_dir a volume, and creates the admin
// socket's directory when admin_addr is a socket.
func (img *dockerImage) checkPortsAndVolume(t *testing.T, cfg *config.Config) {
	t.Helper()
	var exposed []string
	for _, in := range img.byCmd["EXPOSE"] {
		exposed = append(exposed, in.words(t)...)
	}
	got := map[int32]string{}
	for _, e := range exposed {
		n, err := strconv.ParseInt(strings.TrimSuffix(e, "/tcp"), 10, 32)
		if err != nil {
			t.Errorf("EXPOSE %s: %v", e, err)
		}
		got[int32(n)] = e
	}
	if want := configPorts(t, cfg); !equalPorts(got, want) {
		t.Errorf("EXPOSE %q, want the config's ports %v", exposed, want)
	}

	var volumes []string
	for _, in := range img.byCmd["VOLUME"] {
		volumes = append(volumes, in.words(t)...)
	}
	if !slices.Contains(volumes, cfg.Daemon.DataDir) {
		t.Errorf("VOLUME %q does not hold data_dir %q", volumes, cfg.Daemon.DataDir)
	}
	if sock, ok := strings.CutPrefix(cfg.Daemon.AdminAddr, "unix:"); ok && !strings.Contains(img.stageRuns(img.runtime), path.Dir(sock)) {
		t.Errorf("no RUN of the runtime stage creates %s, the admin socket's directory", path.Dir(sock))
	}
}

// checkHealthcheck checks that the image has one HEALTHCHECK, which runs
// `ingestor healthcheck` on the port of cfg's http_addr.
func (img *dockerImage) checkHealthcheck(t *testing.T, cfg *config.Config) {
	t.Helper()
	hc := img.byCmd["HEALTHCHECK"]
	if len(hc) != 1 {
		t.Fatalf("want one HEALTHCHECK, have %d", len(hc))
	}
	_, check, ok := strings.Cut(hc[0].args, "CMD ")
	var hcArgs []string
	if ok {
		hcArgs = dockerInstruction{line: hc[0].line, cmd: "HEALTHCHECK", args: strings.TrimSpace(check)}.words(t)
	}
	if len(hcArgs) < 2 || hcArgs[0] != "ingestor" || hcArgs[1] != "healthcheck" ||
		portNumber(t, flagValue(hcArgs, "--addr")) != portNumber(t, cfg.Daemon.HTTPAddr) {
		t.Errorf("HEALTHCHECK %s: want CMD [\"ingestor\", \"healthcheck\", \"--addr\", ...] on http_addr's port", hc[0].args)
	}
}

// dockerfileUser returns the numeric user and group of the Dockerfile's
// last USER, failing unless both are numbers: Kubernetes' runAsNonRoot can
// check only a numeric user.
func dockerfileUser(t *testing.T) (uid, gid int64) {
	t.Helper()
	var user string
	for _, in := range parseDockerfile(t, dockerfilePath) {
		if in.cmd == "USER" {
			user = in.args
		}
	}
	u, g, _ := strings.Cut(user, ":")
	uid, errU := strconv.ParseInt(u, 10, 64)
	gid, errG := strconv.ParseInt(g, 10, 64)
	if errU != nil || errG != nil {
		t.Fatalf("USER %q: want numeric UID:GID (runAsNonRoot cannot check a name)", user)
	}
	return uid, gid
}

// dockerignorePatterns returns the patterns of .dockerignore.
func dockerignorePatterns(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dockerignorePath)
	if err != nil {
		t.Fatal(err)
	}
	var pats []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.Contains(line, "**") || strings.HasPrefix(line, "!") {
			t.Fatalf(".dockerignore: %q: this test knows only path.Match patterns", line)
		}
		pats = append(pats, path.Clean(strings.TrimPrefix(line, "/")))
	}
	return pats
}

// ignoredBy returns the pattern that excludes p or one of its parent
// directories, or "".
func ignoredBy(t *testing.T, patterns []string, p string) string {
	t.Helper()
	for p = path.Clean(p); p != "." && p != "/"; p = path.Dir(p) {
		for _, pat := range patterns {
			ok, err := path.Match(pat, p)
			if err != nil {
				t.Fatalf(".dockerignore: %q: %v", pat, err)
			}
			if ok {
				return pat
			}
		}
	}
	return ""
}

// curveKeysDir returns a directory holding what the image's config and the
// pod expect at curveSecretDir: the daemon's secret key, daemon.key, and
// the processors' public keys, processors.pub.
func curveKeysDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	newCurvePair(t, dir, "daemon")
	newCurvePair(t, dir, "processor")
	if err := os.Rename(filepath.Join(dir, "processor.pub"), filepath.Join(dir, "processors.pub")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// checkContainerConfig checks the choices a container's config must make:
// the ops listener reachable by probes from outside the container,
// ZeroMQ sockets beyond loopback only with CURVE, data_dir absolute and a
// file raw store inside it (nothing written to the container's root).
func checkContainerConfig(t *testing.T, cfg *config.Config) {
	t.Helper()
	if config.LoopbackAddr(cfg.Daemon.HTTPAddr) {
		t.Errorf("http_addr %q is loopback: probes and Prometheus cannot reach it", cfg.Daemon.HTTPAddr)
	}
	for _, ep := range []string{cfg.Publish.Endpoint, cfg.Publish.AckEndpoint} {
		if hostPort, ok := strings.CutPrefix(ep, "tcp://"); ok && !config.LoopbackAddr(hostPort) && cfg.Publish.CurveSecretKeyFile == "" {
			t.Errorf("ZeroMQ endpoint %s listens beyond loopback without CURVE: anyone who reaches it reads events or clears frames", ep)
		}
	}
	if !path.IsAbs(cfg.Daemon.DataDir) {
		t.Errorf("data_dir %q is relative", cfg.Daemon.DataDir)
	}
	dirs := []string{cfg.RawStore.SpillDir}
	if dir, ok := strings.CutPrefix(cfg.RawStore.URL, "file://"); ok {
		dirs = append(dirs, dir)
	}
	for _, dir := range dirs {
		if !strings.HasPrefix(path.Clean(dir)+"/", path.Clean(cfg.Daemon.DataDir)+"/") {
			t.Errorf("%s is outside data_dir %s: it would be written to the container's root", dir, cfg.Daemon.DataDir)
		}
	}
}

// configPorts returns the TCP ports cfg listens on beyond loopback, by
// number: http_addr, the ZeroMQ endpoints, the push listener when an
// enabled source needs it, and admin_addr when it is a TCP address.
func configPorts(t *testing.T, cfg *config.Config) map[int32]string {
	t.Helper()
	ports := map[int32]string{portNumber(t, cfg.Daemon.HTTPAddr): "http_addr"}
	for name, ep := range map[string]string{"endpoint": cfg.Publish.Endpoint, "ack_endpoint": cfg.Publish.AckEndpoint} {
		if hostPort, ok := strings.CutPrefix(ep, "tcp://"); ok {
			ports[portNumber(t, hostPort)] = name
		}
	}
	if config.PushEnabled(cfg.Sources) {
		ports[portNumber(t, cfg.Push.Addr)] = "push.addr"
	}
	if a := cfg.Daemon.AdminAddr; a != "" && !strings.HasPrefix(a, "unix:") && !config.LoopbackAddr(a) {
		ports[portNumber(t, a)] = "admin_addr"
	}
	return ports
}

// portNumber returns the port of host:port as a number.
func portNumber(t *testing.T, addr string) int32 {
	t.Helper()
	n, err := strconv.ParseInt(portOf(t, addr), 10, 32)
	if err != nil {
		t.Fatalf("%q: port %v", addr, err)
	}
	return int32(n)
}
