package daemon

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// The Kubernetes manifests: a kustomize base and the cluster-mode overlay.
const (
	kubernetesBase    = "../../deploy/kubernetes/base"
	kubernetesCluster = "../../deploy/kubernetes/cluster"
	// kubeNamespace is the namespace the pods are simulated in.
	kubeNamespace = "ingest"
)

// kubeObjects are the objects of a kustomization, decoded.
type kubeObjects struct {
	statefulSets []*appsv1.StatefulSet
	deployments  []*appsv1.Deployment
	services     []*corev1.Service
	configMaps   []*corev1.ConfigMap
	pdbs         []*policyv1.PodDisruptionBudget
}

// loadKubeObjects renders the kustomization in dir (kustomizeRender) and
// decodes every object strictly into the API type of its kind, so that an
// unknown or misspelt field, a value of the wrong type or an unexpected
// kind fails.
func loadKubeObjects(t *testing.T, dir string) kubeObjects {
	t.Helper()
	docs, err := kustomizeRender(dir)
	if err != nil {
		t.Fatalf("render %s: %v", dir, err)
	}
	var objs kubeObjects
	for _, doc := range docs {
		b, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		if err := objs.decode(b); err != nil {
			t.Errorf("%s: %s %v: %v", dir, doc["kind"], doc["metadata"], err)
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
	want := map[string]string{"StatefulSet": "apps/v1", "Deployment": "apps/v1", "Service": "v1", "ConfigMap": "v1", "PodDisruptionBudget": "policy/v1"}[tm.Kind]
	switch {
	case want == "":
		return fmt.Errorf("kind %q: this test knows StatefulSet, Deployment, Service, ConfigMap and PodDisruptionBudget", tm.Kind)
	case tm.APIVersion != want:
		return fmt.Errorf("%s has apiVersion %q, want %q", tm.Kind, tm.APIVersion, want)
	}
	var err error
	switch tm.Kind {
	case "StatefulSet":
		o.statefulSets, err = decodeStrict(doc, o.statefulSets)
	case "Deployment":
		o.deployments, err = decodeStrict(doc, o.deployments)
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
		"unknown kind":   "apiVersion: apps/v1\nkind: DaemonSet\n",
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

// TestDeployKubernetes renders deploy/kubernetes/base and checks that its
// daemon fits together (checkDaemon), outside cluster mode.
func TestDeployKubernetes(t *testing.T) {
	objs := loadKubeObjects(t, kubernetesBase)
	d := checkDaemon(t, objs, 0)
	if d.cfg.Cluster.Enabled {
		t.Errorf("the base enables [cluster]: that is the overlay's job")
	}
}

// TestDeployKubernetesCluster renders the overlay deploy/kubernetes/cluster
// and checks, besides what checkDaemon checks: each member's name and
// advertised host come from its pod (for every replica), the headless
// Service publishes members before they are ready, etcd is reached over
// https with the CA and client certificate from a Secret, the [cluster]
// keys an operator tunes are written out with a comment, etcd's
// --max-txn-ops in deploy/README.md is the config's, the
// PodDisruptionBudget evicts one member at a time, and the processors
// follow the members with the config's etcd endpoints and cluster name
// (checkProcessor).
func TestDeployKubernetesCluster(t *testing.T) {
	objs := loadKubeObjects(t, kubernetesCluster)
	d := checkDaemon(t, objs, 1)
	cfg := d.cfg
	if !cfg.Cluster.Enabled {
		t.Fatalf("the overlay's config does not enable [cluster]")
	}
	replicas := int32(1)
	if r := d.sts.Spec.Replicas; r != nil {
		replicas = *r
	}
	if replicas < 3 {
		t.Errorf("%d replicas: a cluster wants at least 3, so that a member away leaves two to share its sources", replicas)
	}
	for i := range replicas {
		pod := fmt.Sprintf("%s-%d", d.sts.Name, i)
		c := d.config(t, pod)
		if m, err := c.Cluster.Member(); err != nil || m != pod {
			t.Errorf("pod %s: member name %q (%v), want the pod's name, from ${POD_NAME}", pod, m, err)
		}
		if want := pod + "." + d.svc.Name + "." + kubeNamespace + ".svc"; c.Cluster.AdvertiseHost != want {
			t.Errorf("pod %s: advertise_host %q, want its name in the headless Service, %q", pod, c.Cluster.AdvertiseHost, want)
		}
	}
	if !d.svc.Spec.PublishNotReadyAddresses {
		t.Errorf("the Service does not publish members that are not ready: processors could not reach a member that is starting or draining")
	}
	for _, ep := range cfg.Cluster.EtcdEndpoints {
		if !strings.HasPrefix(ep, "https://") {
			t.Errorf("etcd endpoint %q is not https", ep)
		}
	}
	for key, file := range map[string]string{"etcd_ca_file": cfg.Cluster.EtcdCAFile, "etcd_cert_file": cfg.Cluster.EtcdCertFile, "etcd_key_file": cfg.Cluster.EtcdKeyFile} {
		if !slices.Contains(slices.Collect(maps.Values(d.secretMounts)), filepath.Dir(file)) {
			t.Errorf("cluster.%s %q is not a file of a Secret mounted in the pod", key, file)
		}
	}
	checkKeysCommented(t, d.toml, "cluster", "member_name", "advertise_host", "lease_ttl", "checkpoint_interval", "rebalance_delay", "compact_interval", "max_txn_ops")
	doc, err := os.ReadFile(deployREADME)
	if err != nil {
		t.Fatal(err)
	}
	if flag := fmt.Sprintf("--max-txn-ops=%d", cfg.Cluster.MaxTxnOps); !bytes.Contains(doc, []byte(flag)) {
		t.Errorf("deploy/README.md does not give etcd %s, the config's cluster.max_txn_ops", flag)
	}
	if mu := d.pdb.Spec.MaxUnavailable; mu == nil || mu.String() != "1" {
		t.Errorf("the PodDisruptionBudget's maxUnavailable is %v, want 1: one member away at a time", mu)
	}
	if len(objs.deployments) != 1 {
		t.Fatalf("want one Deployment, the processors; have %d", len(objs.deployments))
	}
	checkProcessor(t, objs.deployments[0], d)
}

// daemonManifests is the daemon of a rendering, as checkDaemon found it.
type daemonManifests struct {
	sts *appsv1.StatefulSet
	svc *corev1.Service
	pdb *policyv1.PodDisruptionBudget
	// toml is the ConfigMap's config; cfg is what pod ordinal 0 makes of it.
	toml string
	cfg  *config.Config
	// file names the config in errors: ConfigMap:key.
	file string
	// secretMounts maps the path of each Secret mount to a directory
	// holding the Secret's items, made for the test; the config is read
	// with the one in place of the other.
	secretMounts map[string]string
}

// config parses the ConfigMap's config as the pod named pod sees it: with
// the container's environment and the files of its Secret mounts.
func (d *daemonManifests) config(t *testing.T, pod string) *config.Config {
	t.Helper()
	c := d.sts.Spec.Template.Spec.Containers[0]
	env, _, err := podEnv(c, pod)
	if err != nil {
		t.Fatal(err)
	}
	data := d.toml
	for dir, sim := range d.secretMounts {
		data = strings.ReplaceAll(data, dir+"/", sim+"/")
	}
	cfg, err := config.ParseWithEnv(d.file, []byte(data), func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	})
	if err != nil {
		t.Fatalf("the ConfigMap's config in pod %s, with the pod's environment and files:\n%v", pod, err)
	}
	return cfg
}

// checkDaemon checks that the daemon's manifests fit together: one
// StatefulSet, Service, ConfigMap and PodDisruptionBudget, besides
// deployments Deployments (the processors); the ConfigMap's TOML passes
// validation with the environment and the files the pod gives it, its
// ports are the container's and the Service's, the probes and the Service
// name container ports, the Service and the PodDisruptionBudget select the
// pods, every volume mount names a volume, data_dir is on the claim, the
// config mount sees ConfigMap updates (watch_config), the grace period
// outlasts the drain (and in cluster mode the hand-over), the pod runs as
// the image's non-root user on a read-only root, and every Secret it
// references is created in deploy/README.md.
func checkDaemon(t *testing.T, objs kubeObjects, deployments int) *daemonManifests {
	t.Helper()
	if len(objs.statefulSets) != 1 || len(objs.services) != 1 || len(objs.configMaps) != 1 || len(objs.pdbs) != 1 || len(objs.deployments) != deployments {
		t.Fatalf("want one StatefulSet, Service, ConfigMap and PodDisruptionBudget and %d Deployments; have %d, %d, %d, %d and %d",
			deployments, len(objs.statefulSets), len(objs.services), len(objs.configMaps), len(objs.pdbs), len(objs.deployments))
	}
	sts, svc, cm, pdb := objs.statefulSets[0], objs.services[0], objs.configMaps[0], objs.pdbs[0]
	d := &daemonManifests{sts: sts, svc: svc, pdb: pdb}
	pod := sts.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("want one container in the pod, have %d", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	d.checkSelectors(t, pod.Labels)

	// Volumes: every mount names a pod volume or a claim template.
	claims := map[string]bool{}
	for _, pvc := range sts.Spec.VolumeClaimTemplates {
		claims[pvc.Name] = true
	}
	volumes, mounts := podMounts(t, pod.Spec, c, claims)
	d.readConfigMap(t, cm, c, volumes, mounts)

	// The pod's environment (${NAME} may use only what the container
	// sets) and files: those under a Secret mount are simulated by a
	// directory holding the Secret's items, made for the test.
	_, secrets, err := podEnv(c, sts.Name+"-0")
	if err != nil {
		t.Fatal(err)
	}
	var mountSecrets []string
	d.secretMounts, mountSecrets = checkSecretMounts(t, volumes, mounts)
	secrets = append(secrets, mountSecrets...)
	cfg := d.config(t, sts.Name+"-0")
	d.cfg = cfg
	checkContainerConfig(t, cfg)
	checkDaemonSettings(t, cfg, volumes, mounts, claims)

	d.checkPorts(t, c)
	checkGracePeriod(t, pod.Spec, cfg)
	checkPodSecurity(t, pod.Spec, c)
	checkSecretsCreated(t, "the daemon", secrets)
	return d
}

// checkSelectors checks that the StatefulSet, the Service and the
// PodDisruptionBudget select the pods, whose labels are podLabels, and
// that the StatefulSet's service is the headless Service.
func (d *daemonManifests) checkSelectors(t *testing.T, podLabels map[string]string) {
	t.Helper()
	sts, svc, pdb := d.sts, d.svc, d.pdb
	// Labels and selectors.
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(podLabels)) {
		t.Errorf("StatefulSet selector %v does not select its pod template's labels %v (%v)", sts.Spec.Selector, podLabels, err)
	}
	if svcSel := labels.SelectorFromSet(svc.Spec.Selector); len(svc.Spec.Selector) == 0 || !svcSel.Matches(labels.Set(podLabels)) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, podLabels)
	}
	if pdbSel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || pdbSel.Empty() || !pdbSel.Matches(labels.Set(podLabels)) {
		t.Errorf("PodDisruptionBudget selector %v does not select the pods %v (%v)", pdb.Spec.Selector, podLabels, err)
	}
	if sts.Spec.ServiceName != svc.Name || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("StatefulSet serviceName %q: want the headless Service %q (clusterIP %q)", sts.Spec.ServiceName, svc.Name, svc.Spec.ClusterIP)
	}
}

// readConfigMap finds the config container c runs in the ConfigMap cm,
// through a mount of it that sees updates, and keeps it in d.toml, named
// d.file.
func (d *daemonManifests) readConfigMap(t *testing.T, cm *corev1.ConfigMap, c corev1.Container, volumes map[string]corev1.Volume, mounts map[string]corev1.VolumeMount) {
	t.Helper()
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
	d.file = cm.Name + ":" + path.Base(cfgPath)
	if d.toml, ok = cm.Data[path.Base(cfgPath)]; !ok {
		t.Fatalf("the ConfigMap %q has no key %q (the container's config)", cm.Name, path.Base(cfgPath))
	}
}

// checkDaemonSettings checks the daemon's config cfg against the pod's
// volumes and mounts: an admin token, watch_config on, data_dir on a
// claim template and the admin socket, if any, on a writable emptyDir.
func checkDaemonSettings(t *testing.T, cfg *config.Config, volumes map[string]corev1.Volume, mounts map[string]corev1.VolumeMount, claims map[string]bool) {
	t.Helper()
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
}

// checkPorts checks that the config's listeners are the ports of the
// daemon's container c and of the Service, and that the probes ask the ops
// listener.
func (d *daemonManifests) checkPorts(t *testing.T, c corev1.Container) {
	t.Helper()
	cfg, svc := d.cfg, d.svc
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
}

// checkGracePeriod checks that the pod's termination grace period outlasts
// what the daemon of cfg takes to stop.
func checkGracePeriod(t *testing.T, spec corev1.PodSpec, cfg *config.Config) {
	t.Helper()
	// Shutdown: SIGTERM drains the acks within shutdown_grace; in cluster
	// mode the member then hands its sources over, a fetch in progress
	// ending by its lease's deadline (under lease_ttl), and leaves.
	need, why := cfg.Daemon.ShutdownGrace, "daemon.shutdown_grace "+cfg.Daemon.ShutdownGrace.String()
	if cfg.Cluster.Enabled {
		need += cfg.Cluster.LeaseTTL + 15*time.Second
		why += " + cluster.lease_ttl " + cfg.Cluster.LeaseTTL.String() + " + 15s"
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds %s must exceed %s = %s, or the kubelet kills the daemon mid-drain", show(g), why, need)
	}
}

// checkProcessor checks the processors' Deployment against the daemon d:
// it runs the image's processor following the members (-etcd and -cluster
// as the members' config has them, -etcd-ca, -etcd-cert and -etcd-key, the
// CURVE keys, each a file of a Secret mount), selects its own pods and no
// daemon's selector takes them, and it has the daemon's security, resources
// and documented Secrets.
func checkProcessor(t *testing.T, dep *appsv1.Deployment, d *daemonManifests) {
	t.Helper()
	pod := dep.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("want one container in the processor pod, have %d", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector); err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("Deployment selector %v does not select its pod template's labels %v (%v)", dep.Spec.Selector, pod.Labels, err)
	}
	for what, s := range map[string]*metav1.LabelSelector{"StatefulSet": d.sts.Spec.Selector, "PodDisruptionBudget": d.pdb.Spec.Selector,
		"Service": {MatchLabels: d.svc.Spec.Selector}} {
		if sel, err := metav1.LabelSelectorAsSelector(s); err != nil || sel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("the daemon's %s selector %v also selects the processors' pods %v (%v)", what, s, pod.Labels, err)
		}
	}
	if !slices.Equal(c.Command, []string{"processor"}) || c.Image != d.sts.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("the processor container runs %q of image %q, want processor of the daemon's image", c.Command, c.Image)
	}
	cl := d.cfg.Cluster
	if got, want := flagValue(c.Args, "-etcd"), strings.Join(cl.EtcdEndpoints, ","); got != want {
		t.Errorf("processor -etcd %q, want the members' etcd_endpoints %q", got, want)
	}
	if got := flagValue(c.Args, "-cluster"); got != cl.Name {
		t.Errorf("processor -cluster %q, want the members' cluster.name %q", got, cl.Name)
	}
	volumes, mounts := podMounts(t, pod.Spec, c, nil)
	sims, secrets := checkSecretMounts(t, volumes, mounts)
	for _, flag := range []string{"-etcd-ca", "-etcd-cert", "-etcd-key", "-curve-server-key", "-curve-secret-key"} {
		file := flagValue(c.Args, flag)
		if sim, ok := sims[path.Dir(file)]; !ok {
			t.Errorf("processor %s %q is not in a Secret mount of its pod", flag, file)
		} else if _, err := os.Stat(filepath.Join(sim, path.Base(file))); err != nil {
			t.Errorf("processor %s %q is not an item of the Secret mounted there", flag, file)
		}
	}
	checkPodSecurity(t, pod.Spec, c)
	checkSecretsCreated(t, "the processor", secrets)
}

// podMounts returns the volumes of spec and the mounts of c by mount path,
// and reports a mount that names neither a volume nor a claim template.
func podMounts(t *testing.T, spec corev1.PodSpec, c corev1.Container, claims map[string]bool) (map[string]corev1.Volume, map[string]corev1.VolumeMount) {
	t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
		if claims[v.Name] {
			t.Errorf("volume %q is both a pod volume and a claim template", v.Name)
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		if _, ok := volumes[m.Name]; !ok && !claims[m.Name] {
			t.Errorf("volume mount %s names %q, which is neither a volume nor a claim template", m.MountPath, m.Name)
		}
		mounts[m.MountPath] = m
	}
	return volumes, mounts
}

// podEnv returns the variables container c sets, as the pod named pod in
// kubeNamespace sees them (a Secret's value is a made-up token), and the
// Secrets they come from; an error for what the test cannot simulate.
func podEnv(c corev1.Container, pod string) (map[string]string, []string, error) {
	env := map[string]string{}
	var secrets []string
	var errs []error
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret-from-the-pod-0123456789"
			secrets = append(secrets, e.ValueFrom.SecretKeyRef.Name)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = pod
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env[e.Name] = kubeNamespace
		default:
			errs = append(errs, fmt.Errorf("env %s: this test knows values, secretKeyRef and fieldRef metadata.name and metadata.namespace, not %v", e.Name, e.ValueFrom))
		}
	}
	if len(c.EnvFrom) > 0 {
		errs = append(errs, errors.New("envFrom hides from this test which variables the config can use; list them in env"))
	}
	return env, secrets, errors.Join(errs...)
}

// checkSecretMounts checks the mounts (by path) of Secret volumes:
// read-only, not world-readable, their items listed and each a file the
// test can make (secretItems). It returns, for each mount's path, a
// directory holding its items, and the Secrets' names.
func checkSecretMounts(t *testing.T, volumes map[string]corev1.Volume, mounts map[string]corev1.VolumeMount) (map[string]string, []string) {
	t.Helper()
	pool := secretItems(t)
	sims := map[string]string{}
	var secrets []string
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
			t.Errorf("the Secret %q has no defaultMode: its files would be 0644, and a world-readable secret key is refused", v.Secret.SecretName)
		} else if *mode&0o007 != 0 {
			t.Errorf("the Secret %q has defaultMode %#o: a world-readable secret key is refused", v.Secret.SecretName, *mode)
		}
		if len(v.Secret.Items) == 0 {
			t.Errorf("the Secret %q lists no items: this test cannot know its files", v.Secret.SecretName)
		}
		sims[dir] = t.TempDir()
		for _, item := range v.Secret.Items {
			data, err := os.ReadFile(filepath.Join(pool, item.Path))
			if err != nil {
				t.Errorf("Secret %q item %q: this test has no file for it (%v)", v.Secret.SecretName, item.Path, err)
				continue
			}
			if err := os.WriteFile(filepath.Join(sims[dir], item.Path), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return sims, secrets
}

// checkPodSecurity checks that container c of spec runs as the image's
// non-root user on a read-only root, without privileges or the service
// account's token, and with resource requests and limits.
func checkPodSecurity(t *testing.T, spec corev1.PodSpec, c corev1.Container) {
	t.Helper()
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, lim := c.Resources.Requests[r], c.Resources.Limits[r]
		if req.IsZero() || lim.IsZero() || req.Cmp(lim) > 0 {
			t.Errorf("%s: %s: request %s and limit %s: want both, the request at most the limit", c.Name, r, req.String(), lim.String())
		}
	}
	uid, gid := dockerfileUser(t)
	psc, sc := spec.SecurityContext, c.SecurityContext
	switch {
	case psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot:
		t.Errorf("the pod of %s does not set runAsNonRoot", c.Name)
	case psc.RunAsUser == nil || *psc.RunAsUser != uid || psc.RunAsGroup == nil || *psc.RunAsGroup != gid || psc.FSGroup == nil || *psc.FSGroup != gid:
		t.Errorf("the pod of %s runs as %s:%s with fsGroup %s, want the image's user %d:%d", c.Name, show(psc.RunAsUser), show(psc.RunAsGroup), show(psc.FSGroup), uid, gid)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the securityContext of %s %+v: want readOnlyRootFilesystem, no privilege escalation, every capability dropped", c.Name, sc)
	}
	if a := spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("the pod of %s mounts a service account token it never uses", c.Name)
	}
}

// checkSecretsCreated checks that deploy/README.md says how to create
// each of secrets, which who references.
func checkSecretsCreated(t *testing.T, who string, secrets []string) {
	t.Helper()
	doc, err := os.ReadFile(deployREADME)
	if err != nil {
		t.Fatal(err)
	}
	if len(secrets) == 0 {
		t.Errorf("%s references no Secret", who)
	}
	for _, s := range secrets {
		if !bytes.Contains(doc, []byte("kubectl create secret generic "+s+" ")) {
			t.Errorf("deploy/README.md does not say how to create the Secret %q of %s (kubectl create secret generic %s ...)", s, who, s)
		}
	}
}

// secretItems returns a directory holding a file for each Secret item
// the pods mount: the CURVE keys (curveKeysDir) and an etcd CA's
// certificate with a client certificate and key, made for the test.
func secretItems(t *testing.T) string {
	t.Helper()
	dir := curveKeysDir(t)
	pki := testsync.NewPKI(t)
	ca, err := os.ReadFile(pki.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(pki.Client.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"ca.crt": ca,
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.Client.Certificate[0]}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// checkKeysCommented checks that each of keys is set in the [table] of
// the TOML text, on a line right after a comment.
func checkKeysCommented(t *testing.T, toml, table string, keys ...string) {
	t.Helper()
	commented := map[string]bool{}
	in, prevComment := false, false
	keyLine := regexp.MustCompile(`^([A-Za-z0-9_-]+)\s*=`)
	for _, line := range strings.Split(toml, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "["):
			in = line == "["+table+"]"
		case in:
			if m := keyLine.FindStringSubmatch(line); m != nil {
				commented[m[1]] = prevComment
			}
		}
		prevComment = strings.HasPrefix(line, "#")
	}
	for _, k := range keys {
		if c, ok := commented[k]; !ok || !c {
			t.Errorf("the config does not set %s.%s after a comment saying what it does (set: %v, commented: %v)", table, k, ok, c)
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
