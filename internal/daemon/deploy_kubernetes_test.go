package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/ingestorhq/ingestor/config"
)

// kubernetesDir holds the Kubernetes manifests.
const kubernetesDir = "../../deploy/kubernetes"

// kubeObjects are the manifests of deploy/kubernetes, decoded.
type kubeObjects struct {
	statefulSets []*appsv1.StatefulSet
	services     []*corev1.Service
	configMaps   []*corev1.ConfigMap
	pdbs         []*policyv1.PodDisruptionBudget
}

// loadKubeObjects decodes every document of every *.yaml file of dir
// strictly into the API type of its kind, so that an unknown or misspelt
// field, a value of the wrong type or an unexpected kind fails.
func loadKubeObjects(t *testing.T, dir string) kubeObjects {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifest in %s", dir)
	}
	var objs kubeObjects
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(data, []byte("\n---\n")) {
			if err := objs.decode(doc); err != nil {
				t.Errorf("%s: document %d: %v", file, i+1, err)
			}
		}
	}
	return objs
}

// decode adds the object doc holds.
func (o *kubeObjects) decode(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	want := map[string]string{"StatefulSet": "apps/v1", "Service": "v1", "ConfigMap": "v1", "PodDisruptionBudget": "policy/v1"}[tm.Kind]
	switch {
	case want == "":
		return fmt.Errorf("kind %q: this test knows StatefulSet, Service, ConfigMap and PodDisruptionBudget", tm.Kind)
	case tm.APIVersion != want:
		return fmt.Errorf("%s has apiVersion %q, want %q", tm.Kind, tm.APIVersion, want)
	}
	var err error
	switch tm.Kind {
	case "StatefulSet":
		o.statefulSets, err = decodeStrict(doc, o.statefulSets)
	case "Service":
		o.services, err = decodeStrict(doc, o.services)
	case "ConfigMap":
		o.configMaps, err = decodeStrict(doc, o.configMaps)
	case "PodDisruptionBudget":
		o.pdbs, err = decodeStrict(doc, o.pdbs)
	}
	return err
}

// decodeStrict decodes doc into a new T as the API server does: YAML to
// JSON (a duplicate key is an error), then JSON with field names matched
// case-sensitively, refusing unknown fields. (yaml.UnmarshalStrict matches
// names as encoding/json does, ignoring case, so it would take
// readOnlyRootFileSystem for readOnlyRootFilesystem; the API server drops
// such a field.) It appends the object to list.
func decodeStrict[T any](doc []byte, list []*T) ([]*T, error) {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return list, err
	}
	obj := new(T)
	strict, err := kjson.UnmarshalStrict(j, obj, kjson.DisallowUnknownFields)
	if err != nil {
		return list, err
	}
	if len(strict) > 0 {
		return list, errors.Join(strict...)
	}
	return append(list, obj), nil
}

// TestKubeDecodeIsStrict checks that the decoding of TestDeployKubernetes
// refuses what kubectl would refuse or silently drop, so that it cannot
// pass on a misspelt manifest.
func TestKubeDecodeIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"misspelt field": "apiVersion: v1\nkind: Service\nspec:\n  selectr: {a: b}\n",
		"wrong type":     "apiVersion: v1\nkind: Service\nspec:\n  ports: [{port: http}]\n",
		"duplicate key":  "apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\ndata: {c: d}\n",
		"field case":     "apiVersion: v1\nkind: Service\nspec:\n  clusterIp: None\n",
		"old apiVersion": "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\n",
		"unknown kind":   "apiVersion: apps/v1\nkind: Deployment\n",
	} {
		var objs kubeObjects
		if err := objs.decode([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
	var objs kubeObjects
	if err := objs.decode([]byte("apiVersion: v1\nkind: Service\nspec:\n  selector: {a: b}\n")); err != nil || len(objs.services) != 1 {
		t.Errorf("a valid Service: %v, %d decoded", err, len(objs.services))
	}
}

// TestDeployKubernetes decodes the manifests of deploy/kubernetes and
// checks that they fit together: the ConfigMap's TOML passes validation
// with the environment and the files the pod gives it, its ports are the
// container's and the Service's, the probes and the Service name container
// ports, the Service and the PodDisruptionBudget select the pods, every
// volume mount names a volume, data_dir is on the claim, the config mount
// sees ConfigMap updates (watch_config), the pod runs as the image's
// non-root user on a read-only root, and every Secret it references is
// created in deploy/README.md.
func TestDeployKubernetes(t *testing.T) {
	objs := loadKubeObjects(t, kubernetesDir)
	if len(objs.statefulSets) != 1 || len(objs.services) != 1 || len(objs.configMaps) != 1 || len(objs.pdbs) != 1 {
		t.Fatalf("want one StatefulSet, Service, ConfigMap and PodDisruptionBudget; have %d, %d, %d and %d",
			len(objs.statefulSets), len(objs.services), len(objs.configMaps), len(objs.pdbs))
	}
	sts, svc, cm, pdb := objs.statefulSets[0], objs.services[0], objs.configMaps[0], objs.pdbs[0]
	pod := sts.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("want one container in the pod, have %d", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]

	// Labels and selectors.
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("StatefulSet selector %v does not select its pod template's labels %v (%v)", sts.Spec.Selector, pod.Labels, err)
	}
	if svcSel := labels.SelectorFromSet(svc.Spec.Selector); len(svc.Spec.Selector) == 0 || !svcSel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, pod.Labels)
	}
	if pdbSel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || pdbSel.Empty() || !pdbSel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("PodDisruptionBudget selector %v does not select the pods %v (%v)", pdb.Spec.Selector, pod.Labels, err)
	}
	if sts.Spec.ServiceName != svc.Name || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("StatefulSet serviceName %q: want the headless Service %q (clusterIP %q)", sts.Spec.ServiceName, svc.Name, svc.Spec.ClusterIP)
	}

	// Volumes: every mount names a pod volume or a claim template.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	claims := map[string]bool{}
	for _, pvc := range sts.Spec.VolumeClaimTemplates {
		claims[pvc.Name] = true
		if _, ok := volumes[pvc.Name]; ok {
			t.Errorf("volume %q is both a pod volume and a claim template", pvc.Name)
		}
	}
	mounts := map[string]corev1.VolumeMount{} // by mount path
	for _, m := range c.VolumeMounts {
		if _, ok := volumes[m.Name]; !ok && !claims[m.Name] {
			t.Errorf("volume mount %s names %q, which is neither a volume nor a claim template", m.MountPath, m.Name)
		}
		mounts[m.MountPath] = m
	}

	// The config: args -c names a key of the ConfigMap, through a mount of
	// it without subPath (which never sees an update).
	cfgPath := flagValue(c.Args, "-c")
	cfgMount, ok := mounts[path.Dir(cfgPath)]
	if !ok || volumes[cfgMount.Name].ConfigMap == nil || volumes[cfgMount.Name].ConfigMap.Name != cm.Name {
		t.Fatalf("the container's config %q (args %q) is not in a mount of the ConfigMap %q", cfgPath, c.Args, cm.Name)
	}
	if cfgMount.SubPath != "" {
		t.Errorf("the ConfigMap is mounted with subPath %q: such a mount never sees an update", cfgMount.SubPath)
	}
	toml, ok := cm.Data[path.Base(cfgPath)]
	if !ok {
		t.Fatalf("the ConfigMap %q has no key %q (the container's config)", cm.Name, path.Base(cfgPath))
	}

	// The pod's environment: ${NAME} may use only what the container sets.
	env := map[string]string{}
	var secrets []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret-from-the-pod-0123456789"
			secrets = append(secrets, e.ValueFrom.SecretKeyRef.Name)
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		}
	}
	if len(c.EnvFrom) > 0 {
		t.Errorf("envFrom hides from this test which variables the config can use; list them in env")
	}
	// Files the config names under a Secret mount are simulated by a
	// directory holding the Secret's items: CURVE keys made for the test.
	keys := curveKeysDir(t)
	data := toml
	for dir, m := range mounts {
		v := volumes[m.Name]
		if v.Secret == nil {
			continue
		}
		secrets = append(secrets, v.Secret.SecretName)
		if !m.ReadOnly {
			t.Errorf("the Secret %q is mounted writable at %s", v.Secret.SecretName, dir)
		}
		if mode := v.Secret.DefaultMode; mode == nil {
			t.Errorf("the Secret %q has no defaultMode: its files would be 0644, and the daemon refuses a world-readable secret key", v.Secret.SecretName)
		} else if *mode&0o007 != 0 {
			t.Errorf("the Secret %q has defaultMode %#o: the daemon refuses a world-readable secret key", v.Secret.SecretName, *mode)
		}
		for _, item := range v.Secret.Items {
			if _, err := os.Stat(filepath.Join(keys, item.Path)); err != nil {
				t.Errorf("Secret %q item %q: this test has no file for it (%v)", v.Secret.SecretName, item.Path, err)
			}
		}
		data = strings.ReplaceAll(data, dir+"/", keys+"/")
	}
	cfg, err := config.ParseWithEnv(cm.Name+":"+path.Base(cfgPath), []byte(data), func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	})
	if err != nil {
		t.Fatalf("the ConfigMap's config, with the pod's environment and files:\n%v", err)
	}
	checkContainerConfig(t, cfg)
	if cfg.Daemon.AdminToken == "" {
		t.Errorf("the admin endpoints have no token: set daemon.admin_token from the Secret")
	}
	if !cfg.Daemon.WatchConfig {
		t.Errorf("daemon.watch_config is off: a ConfigMap change would not reach the daemon")
	}
	if m, ok := mounts[cfg.Daemon.DataDir]; !ok || !claims[m.Name] {
		t.Errorf("data_dir %q is not the mount of a volume claim template (the queue must outlive the pod)", cfg.Daemon.DataDir)
	}
	if sock, ok := strings.CutPrefix(cfg.Daemon.AdminAddr, "unix:"); ok {
		if m, ok := mounts[path.Dir(sock)]; !ok || m.ReadOnly || volumes[m.Name].EmptyDir == nil {
			t.Errorf("admin socket %s: its directory is not a writable emptyDir mount (the root filesystem is read-only)", sock)
		}
	}

	// Ports: the config's listeners are the container's ports and the
	// Service's, and the probes ask the ops listener.
	want := configPorts(t, cfg)
	containerPorts := map[string]int32{}
	got := map[int32]string{}
	for _, p := range c.Ports {
		containerPorts[p.Name] = p.ContainerPort
		got[p.ContainerPort] = p.Name
	}
	if !equalPorts(got, want) {
		t.Errorf("container ports %v, want the config's %v", got, want)
	}
	svcPorts := map[int32]string{}
	for _, p := range svc.Spec.Ports {
		target := p.TargetPort.IntVal
		if p.TargetPort.StrVal != "" {
			target = containerPorts[p.TargetPort.StrVal]
		}
		if target == 0 || got[target] == "" {
			t.Errorf("Service port %s targets %s, not a container port", p.Name, p.TargetPort.String())
		}
		svcPorts[target] = p.Name
	}
	if !equalPorts(svcPorts, want) {
		t.Errorf("Service ports reach %v, want the config's %v", svcPorts, want)
	}
	httpPort := portNumber(t, cfg.Daemon.HTTPAddr)
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil {
			t.Errorf("no %s probe over HTTP", name)
			continue
		}
		port := probe.HTTPGet.Port.IntVal
		if probe.HTTPGet.Port.StrVal != "" {
			port = containerPorts[probe.HTTPGet.Port.StrVal]
		}
		wantPath := map[string]string{"liveness": "/healthz", "readiness": "/readyz"}[name]
		if port != httpPort || probe.HTTPGet.Path != wantPath {
			t.Errorf("%s probe asks port %s path %s, want http_addr's port %d path %s", name, probe.HTTPGet.Port.String(), probe.HTTPGet.Path, httpPort, wantPath)
		}
	}

	// Shutdown, resources and security.
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || float64(*g) <= cfg.Daemon.ShutdownGrace.Seconds() {
		t.Errorf("terminationGracePeriodSeconds %s must exceed daemon.shutdown_grace %s, or the kubelet kills the daemon mid-drain", show(g), cfg.Daemon.ShutdownGrace)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, lim := c.Resources.Requests[r], c.Resources.Limits[r]
		if req.IsZero() || lim.IsZero() || req.Cmp(lim) > 0 {
			t.Errorf("%s: request %s and limit %s: want both, the request at most the limit", r, req.String(), lim.String())
		}
	}
	uid, gid := dockerfileUser(t)
	psc, sc := pod.Spec.SecurityContext, c.SecurityContext
	switch {
	case psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot:
		t.Errorf("the pod does not set runAsNonRoot")
	case psc.RunAsUser == nil || *psc.RunAsUser != uid || psc.RunAsGroup == nil || *psc.RunAsGroup != gid || psc.FSGroup == nil || *psc.FSGroup != gid:
		t.Errorf("the pod runs as %s:%s with fsGroup %s, want the image's user %d:%d", show(psc.RunAsUser), show(psc.RunAsGroup), show(psc.FSGroup), uid, gid)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the container's securityContext %+v: want readOnlyRootFilesystem, no privilege escalation, every capability dropped", sc)
	}

	// Each Secret the pod needs is created in deploy/README.md.
	doc, err := os.ReadFile(deployREADME)
	if err != nil {
		t.Fatal(err)
	}
	if len(secrets) == 0 {
		t.Errorf("the pod references no Secret: the admin token must come from one")
	}
	for _, s := range secrets {
		if !bytes.Contains(doc, []byte("kubectl create secret generic "+s+" ")) {
			t.Errorf("deploy/README.md does not say how to create the Secret %q (kubectl create secret generic %s ...)", s, s)
		}
	}
}

// show formats an optional number of a manifest.
func show[T int32 | int64](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// flagValue returns the argument after flag in args, or "".
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// equalPorts reports whether got and want hold the same port numbers.
func equalPorts(got, want map[int32]string) bool {
	if len(got) != len(want) {
		return false
	}
	for p := range want {
		if _, ok := got[p]; !ok {
			return false
		}
	}
	return true
}
