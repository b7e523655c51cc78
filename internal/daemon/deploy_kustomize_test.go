package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// This file renders the kustomizations of deploy/kubernetes offline, for
// TestDeployKubernetes and TestDeployKubernetesCluster: kubectl is not a
// test dependency, and kustomize's Go module is far larger than the subset
// the manifests use.

// kustomization is the part of kustomize's Kustomization these manifests
// use: resources, and JSON 6902 patches of one target each. Decoded
// strictly, so any other kustomize feature (generators, name prefixes,
// strategic merge patches, images) fails the test instead of being
// rendered wrongly.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Patches    []struct {
		Path   string `json:"path"`
		Target struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"target"`
	} `json:"patches"`
}

// jsonPatchOp is one operation of a JSON 6902 patch. Only add, remove,
// replace and test are known (no from: move and copy fail to decode).
type jsonPatchOp struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value"`
}

// kustomizeRender renders the kustomization.yaml of dir as `kubectl
// kustomize` does for the features of kustomization: the objects of its
// resources in order (a file's documents, or a directory's own rendering),
// then each patch applied to its one target. Every *.yaml of dir must be a
// resource or a patch, so that no manifest is left out unnoticed.
func kustomizeRender(dir string) ([]map[string]any, error) {
	k, err := readKustomization(dir)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{"kustomization.yaml": true}
	objs, err := k.renderResources(dir, used)
	if err != nil {
		return nil, err
	}
	if err := k.applyPatches(dir, objs, used); err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if !used[filepath.Base(f)] {
			return nil, fmt.Errorf("%s is neither a resource nor a patch of kustomization.yaml", filepath.Base(f))
		}
	}
	return objs, nil
}

// readKustomization decodes the kustomization.yaml of dir, strictly, and
// checks that it is a Kustomization.
func readKustomization(dir string) (*kustomization, error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k kustomization
	if err := unmarshalYAMLStrict(data, &k); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("kustomization.yaml is a %s %s, want a kustomize.config.k8s.io/v1beta1 Kustomization", k.APIVersion, k.Kind)
	}
	return &k, nil
}

// renderResources returns the objects of k's resources in dir, in order: a
// file's documents, or a directory's own rendering. It marks the files it
// read in used.
func (k *kustomization) renderResources(dir string, used map[string]bool) ([]map[string]any, error) {
	var objs []map[string]any
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			sub, err := kustomizeRender(p)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", r, err)
			}
			objs = append(objs, sub...)
			continue
		}
		if strings.Contains(r, "/") {
			return nil, fmt.Errorf("resource %s: this test takes a directory, or a file of the kustomization's own directory", r)
		}
		used[r] = true
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		for i, doc := range bytes.Split(data, []byte("\n---\n")) {
			// encoding/json, as for the patches' values: numbers are
			// float64 in both, which the test operation compares.
			var obj map[string]any
			j, err := yaml.YAMLToJSONStrict(doc)
			if err == nil {
				err = json.Unmarshal(j, &obj)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", r, i+1, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs, nil
}

// applyPatches applies each of k's patches in dir to its one target among
// objs, in place, and marks the patches' files in used.
func (k *kustomization) applyPatches(dir string, objs []map[string]any, used map[string]bool) error {
	for _, pt := range k.Patches {
		used[pt.Path] = true
		data, err := os.ReadFile(filepath.Join(dir, pt.Path))
		if err != nil {
			return err
		}
		var ops []jsonPatchOp
		if err := unmarshalYAMLStrict(data, &ops); err != nil {
			return fmt.Errorf("%s: not a JSON 6902 patch of add, remove, replace and test: %w", pt.Path, err)
		}
		var targets []int
		for i, obj := range objs {
			if meta, _ := obj["metadata"].(map[string]any); obj["kind"] == pt.Target.Kind && meta["name"] == pt.Target.Name {
				targets = append(targets, i)
			}
		}
		if len(targets) != 1 {
			return fmt.Errorf("%s: target %s %q matches %d objects, want 1", pt.Path, pt.Target.Kind, pt.Target.Name, len(targets))
		}
		patched, err := applyJSONPatch(objs[targets[0]], ops)
		if err != nil {
			return fmt.Errorf("%s: %w", pt.Path, err)
		}
		obj, ok := patched.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: the patched object is not an object", pt.Path)
		}
		objs[targets[0]] = obj
	}
	return nil
}

// unmarshalYAMLStrict decodes YAML into v: duplicate keys, unknown fields
// and fields in the wrong case are errors.
func unmarshalYAMLStrict(data []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// applyJSONPatch applies ops to doc as RFC 6902 says, and returns the
// result.
func applyJSONPatch(doc any, ops []jsonPatchOp) (any, error) {
	for i, op := range ops {
		var value any
		switch {
		case op.Op != "add" && op.Op != "remove" && op.Op != "replace" && op.Op != "test":
			return nil, fmt.Errorf("operation %d: op %q: this test knows add, remove, replace and test", i+1, op.Op)
		case op.Op != "remove" && len(op.Value) == 0:
			return nil, fmt.Errorf("operation %d: %s %s has no value", i+1, op.Op, op.Path)
		case op.Op != "remove":
			if err := json.Unmarshal(op.Value, &value); err != nil {
				return nil, err
			}
		}
		if op.Path != "" && !strings.HasPrefix(op.Path, "/") {
			return nil, fmt.Errorf("operation %d: path %q does not start with /", i+1, op.Path)
		}
		var tokens []string
		if op.Path != "" {
			for _, tok := range strings.Split(op.Path[1:], "/") {
				tokens = append(tokens, strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~"))
			}
		}
		var err error
		if doc, err = patchAt(doc, tokens, op.Op, value); err != nil {
			return nil, fmt.Errorf("operation %d (%s %s): %w", i+1, op.Op, op.Path, err)
		}
	}
	return doc, nil
}

// patchAt applies one operation at the pointer tokens below v and returns
// v changed.
func patchAt(v any, tokens []string, op string, value any) (any, error) {
	if len(tokens) == 0 {
		switch op {
		case "test":
			if !reflect.DeepEqual(v, value) {
				return nil, fmt.Errorf("the value is %v, not %v", v, value)
			}
			return v, nil
		case "remove":
			return nil, errors.New("cannot remove the whole document")
		}
		return value, nil
	}
	tok, last := tokens[0], len(tokens) == 1
	switch c := v.(type) {
	case map[string]any:
		child, ok := c[tok]
		switch {
		case last && op == "add":
			c[tok] = value
			return c, nil
		case !ok:
			return nil, fmt.Errorf("no member %q", tok)
		case last && op == "remove":
			delete(c, tok)
			return c, nil
		}
		nv, err := patchAt(child, tokens[1:], op, value)
		c[tok] = nv
		return c, err
	case []any:
		if last && op == "add" && tok == "-" {
			return append(c, value), nil
		}
		i, err := strconv.Atoi(tok)
		switch {
		case err != nil || tok != strconv.Itoa(i) || i < 0:
			return nil, fmt.Errorf("%q is not an array index", tok)
		case last && op == "add" && i <= len(c):
			return slices.Insert(c, i, value), nil
		case i >= len(c):
			return nil, fmt.Errorf("index %d is past the array's %d elements", i, len(c))
		case last && op == "remove":
			return slices.Delete(c, i, i+1), nil
		}
		nv, err := patchAt(c[i], tokens[1:], op, value)
		c[i] = nv
		return c, err
	}
	return nil, fmt.Errorf("%q: %T is neither an object nor an array", tok, v)
}

// TestJSONPatch checks applyJSONPatch against RFC 6902's rules for the
// operations the overlay uses, so that kustomizeRender cannot render a
// patch that kustomize would refuse or apply elsewhere.
func TestJSONPatch(t *testing.T) {
	const doc = `{"spec": {"replicas": 1, "env": [{"name": "A"}], "a/b": {"~c": 1}}}`
	for _, c := range []struct{ ops, want, err string }{
		{ops: `[{"op": "replace", "path": "/spec/replicas", "value": 3}]`, want: `{"spec": {"replicas": 3, "env": [{"name": "A"}], "a/b": {"~c": 1}}}`},
		{ops: `[{"op": "add", "path": "/spec/env/-", "value": {"name": "B"}}, {"op": "add", "path": "/spec/env/0", "value": {"name": "Z"}}]`,
			want: `{"spec": {"replicas": 1, "env": [{"name": "Z"}, {"name": "A"}, {"name": "B"}], "a/b": {"~c": 1}}}`},
		{ops: `[{"op": "test", "path": "/spec/env/0/name", "value": "A"}, {"op": "remove", "path": "/spec/env/0"}, {"op": "add", "path": "/spec/x", "value": null}]`,
			want: `{"spec": {"replicas": 1, "env": [], "a/b": {"~c": 1}, "x": null}}`},
		{ops: `[{"op": "replace", "path": "/spec/a~1b/~0c", "value": 2}]`, want: `{"spec": {"replicas": 1, "env": [{"name": "A"}], "a/b": {"~c": 2}}}`},
		{ops: `[{"op": "test", "path": "/spec/env/0/name", "value": "B"}]`, err: "the value is A, not B"},
		{ops: `[{"op": "replace", "path": "/spec/replica", "value": 3}]`, err: `no member "replica"`},
		{ops: `[{"op": "remove", "path": "/spec/env/1"}]`, err: "index 1 is past the array's 1 elements"},
		{ops: `[{"op": "replace", "path": "/spec/env/01/name", "value": "B"}]`, err: `"01" is not an array index`},
		{ops: `[{"op": "add", "path": "/spec/replicas/x", "value": 1}]`, err: "neither an object nor an array"},
		{ops: `[{"op": "replace", "path": "/spec/replicas"}]`, err: "has no value"},
		{ops: `[{"op": "move", "path": "/spec/replicas", "value": 1}]`, err: `op "move"`},
		{ops: `[{"op": "add", "path": "spec", "value": 1}]`, err: "does not start with /"},
	} {
		var ops []jsonPatchOp
		var in, want any
		if err := errors.Join(json.Unmarshal([]byte(c.ops), &ops), json.Unmarshal([]byte(doc), &in)); err != nil {
			t.Fatal(err)
		}
		got, err := applyJSONPatch(in, ops)
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one with %q", c.ops, err, c.err)
			}
		case err != nil:
			t.Errorf("%s: %v", c.ops, err)
		default:
			if err := json.Unmarshal([]byte(c.want), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s:\ngot  %v\nwant %v", c.ops, got, want)
			}
		}
	}
	var ops []jsonPatchOp
	if err := unmarshalYAMLStrict([]byte("- {op: move, from: /a, path: /b}\n"), &ops); err == nil {
		t.Errorf("a patch with from decoded without an error")
	}
}

// firstDifference describes the first place where the decoded JSON values
// got and want differ, or returns "".
func firstDifference(got, want any, at string) string {
	switch g := got.(type) {
	case map[string]any:
		w, ok := want.(map[string]any)
		if !ok {
			break
		}
		for _, k := range slices.Sorted(maps.Keys(w)) {
			if _, ok := g[k]; !ok {
				return fmt.Sprintf("%s/%s: missing, want %v", at, k, w[k])
			}
		}
		for _, k := range slices.Sorted(maps.Keys(g)) {
			if d := firstDifference(g[k], w[k], at+"/"+k); d != "" {
				return d
			}
		}
		return ""
	case []any:
		w, ok := want.([]any)
		if !ok || len(g) != len(w) {
			break
		}
		for i := range g {
			if d := firstDifference(g[i], w[i], fmt.Sprint(at, "/", i)); d != "" {
				return d
			}
		}
		return ""
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Sprintf("%s: %v (%[2]T), want %v (%[3]T)", at, got, want)
	}
	return ""
}
