package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/sources"
)

func TestExampleCopiesMatch(t *testing.T) {
	root, err := os.ReadFile("../ingestor.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	if string(root) != ExampleTOML {
		t.Error("ingestor.example.toml at the repository root differs from config/ingestor.example.toml; " +
			"edit config/ingestor.example.toml and copy it to the root")
	}
}

func TestExampleLoads(t *testing.T) {
	cfg, err := ParseWithEnv("ingestor.example.toml", []byte(ExampleTOML), envOf(nil))
	if err != nil {
		t.Fatalf("example does not load:\n%v", err)
	}
	var enabled []string
	for _, s := range cfg.Sources {
		if s.Enabled {
			enabled = append(enabled, s.Name)
		}
	}
	if len(enabled) != 1 || enabled[0] != "demo" {
		t.Errorf("enabled sources = %v, want [demo]", enabled)
	}
	demo := source(t, cfg, "demo")
	if demo.Kind != "demo" || demo.Interval != 200*time.Millisecond ||
		!reflect.DeepEqual(demo.Spec, &sources.DemoSpec{EventsPerTick: 1000, EventSize: 256}) {
		t.Errorf("demo = %+v, spec %+v", demo, demo.Spec)
	}
	api := source(t, cfg, "example_api")
	spec, ok := api.Spec.(*sources.HTTPPollSpec)
	if api.Kind != "http_poll" || !ok || !strings.Contains(spec.Headers["Authorization"], "${EXAMPLE_API_TOKEN}") {
		t.Errorf("example_api = %+v, spec %+v", api, api.Spec)
	}
	if cfg.Daemon.DataDir != "./data" || cfg.RawStore.URL != "file://./data/raw" {
		t.Errorf("data_dir %q, raw_store.url %q", cfg.Daemon.DataDir, cfg.RawStore.URL)
	}
	if d := Default(); d.Paths != nil || d.Files != nil || !reflect.DeepEqual(d.Sources, cfg.Sources) {
		t.Errorf("Default() = %+v, want the example with File empty", d)
	}
}

// TestExampleDocumentsEveryKey checks that every key the decoder knows is
// written in the example, set or commented out, under its own table.
func TestExampleDocumentsEveryKey(t *testing.T) {
	known := map[string][]any{
		"daemon":    {daemonTOML{}},
		"raw_store": {rawStoreTOML{}},
		"publish":   {publishTOML{}},
		"defaults":  {defaultsTOML{}},
		"source":    {sourceTOML{}},
		"push":      {pushTOML{}},
	}
	for _, kind := range sources.Kinds() {
		spec, _ := sources.NewSpec(kind)
		known["source"] = append(known["source"], reflect.ValueOf(spec).Elem().Interface())
	}

	header := regexp.MustCompile(`^\[([a-z_]+)`)
	keyLine := regexp.MustCompile(`^#?\s*([a-z0-9_]+)\s*=`)
	// "# [source.example_api.oauth2]" documents its key, oauth2.
	subTable := regexp.MustCompile(`^# \[source\.[a-z_]+\.([a-z0-9_]+)\]$`)
	documented := map[string]bool{}
	table := ""
	for _, line := range strings.Split(ExampleTOML, "\n") {
		if m := subTable.FindStringSubmatch(line); m != nil {
			documented["source."+m[1]] = true
		} else if m := header.FindStringSubmatch(line); m != nil {
			table = m[1]
		} else if m := keyLine.FindStringSubmatch(line); m != nil && table != "" {
			documented[table+"."+m[1]] = true
		}
	}
	for table, types := range known {
		for _, v := range types {
			rt := reflect.TypeOf(v)
			for _, f := range reflect.VisibleFields(rt) {
				if name := tagName(f); name != "" && !documented[table+"."+name] {
					t.Errorf("key %s (%s.%s) is not documented in ingestor.example.toml", name, table, rt.Name())
				}
			}
		}
	}
}
