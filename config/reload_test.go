package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const reloadBase = `
[daemon]
data_dir = "/tmp/ingestor-reload"

[defaults]
interval = "5s"

[rate_limiters.shared]
rate = "10/s"

[source.a]
kind = "demo"

[source.b]
kind = "demo"
interval = "1s"

[source.c]
kind = "http_poll"
poll_url = "http://127.0.0.1:1/feed"
rate_limiter = "shared"

[source.off]
kind = "demo"
enabled = false
`

// loadChange parses base as the running config, writes next to a file
// and returns what reloading it changes.
func loadChange(t *testing.T, base, next string) (Plan, error) {
	t.Helper()
	old, err := Parse("old.toml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ingestor.toml")
	if err := os.WriteFile(path, []byte(next), 0o600); err != nil {
		t.Fatal(err)
	}
	_, plan, err := LoadChange(old, []string{path})
	return plan, err
}

func TestLoadChangePlans(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(string) string
		want Plan
	}{
		"same file": {edit: func(s string) string { return s },
			want: Plan{Stay: []string{"a", "b", "c"}}},
		"blocks moved and comments added": {edit: func(s string) string {
			i := strings.Index(s, "[source.a]")
			return "# moved\n\n" + s[i:] + "\n" + s[:i]
		}, want: Plan{Stay: []string{"a", "b", "c"}}},
		"source added, removed, enabled": {edit: func(s string) string {
			s = strings.Replace(s, "[source.b]\nkind = \"demo\"\ninterval = \"1s\"\n", "", 1)
			s = strings.Replace(s, "enabled = false", "", 1)
			return s + "\n[source.d]\nkind = \"demo\"\n"
		}, want: Plan{Start: []string{"d", "off"}, Stop: []string{"b"}, Stay: []string{"a", "c"}}},
		"source disabled": {edit: func(s string) string {
			return strings.Replace(s, "interval = \"1s\"", "interval = \"1s\"\nenabled = false", 1)
		}, want: Plan{Stop: []string{"b"}, Stay: []string{"a", "c"}}},
		"source changed": {edit: func(s string) string {
			return strings.Replace(s, "interval = \"1s\"", "interval = \"2s\"", 1)
		}, want: Plan{Restart: []string{"b"}, Stay: []string{"a", "c"}}},
		"defaults change restarts the sources inheriting them": {edit: func(s string) string {
			return strings.Replace(s, "interval = \"5s\"", "interval = \"7s\"", 1)
		}, want: Plan{Restart: []string{"a", "c"}, Stay: []string{"b"}}},
		"limiter change restarts the sources naming it": {edit: func(s string) string {
			return strings.Replace(s, "rate = \"10/s\"", "rate = \"20/s\"", 1)
		}, want: Plan{Restart: []string{"c"}, Stay: []string{"a", "b"}}},
		"a disabled source's edit changes nothing": {edit: func(s string) string {
			return strings.Replace(s, "enabled = false", "enabled = false\ninterval = \"9s\"", 1)
		}, want: Plan{Stay: []string{"a", "b", "c"}}},
	} {
		t.Run(name, func(t *testing.T) {
			plan, err := loadChange(t, reloadBase, tc.edit(reloadBase))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(plan, tc.want) {
				t.Errorf("plan %v, want %v", plan, tc.want)
			}
			if plan.Changes() != (len(tc.want.Start)+len(tc.want.Stop)+len(tc.want.Restart) > 0) {
				t.Errorf("Changes() = %v for %v", plan.Changes(), plan)
			}
		})
	}
}

func TestLoadChangeRefusesFixedSettings(t *testing.T) {
	next := strings.Replace(reloadBase, "data_dir = \"/tmp/ingestor-reload\"",
		"data_dir = \"/tmp/elsewhere\"\nhttp_addr = \"127.0.0.1:9999\"", 1)
	next += "\n[publish]\nendpoint = \"tcp://127.0.0.1:7000\"\n\n[cluster]\nlease_ttl = \"20s\"\n\n[source.d]\nkind = \"demo\"\n"
	_, err := loadChange(t, reloadBase, next)
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("err = %v, want Errors", err)
	}
	got := err.Error()
	for _, want := range []string{
		"ingestor.toml:3: daemon.data_dir: changed, but it cannot change while the daemon runs",
		"ingestor.toml:4: daemon.http_addr: changed",
		"ingestor.toml: raw_store.url: changed (its default follows a setting changed here), but",
		"ingestor.toml:29: publish.endpoint: changed",
		"ingestor.toml:32: cluster.lease_ttl: changed",
		"nothing of this edit was applied",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("errors lack %q:\n%s", want, got)
		}
	}
	if len(errs) != 6 { // raw_store.spill_dir follows data_dir too
		t.Errorf("%d errors, want 6:\n%s", len(errs), got)
	}
}

func TestLoadChangeRefusesTheFirstPushSource(t *testing.T) {
	next := reloadBase + "\n[source.hook]\nkind = \"webhook\"\n"
	_, err := loadChange(t, reloadBase, next)
	if err == nil || !strings.Contains(err.Error(), `source "hook": the first enabled push source needs the push listener (push.addr)`) {
		t.Fatalf("err = %v", err)
	}
	withPush := reloadBase + "\n[source.hook]\nkind = \"webhook\"\n"
	plan, err := loadChange(t, withPush, withPush+"\n[source.hook2]\nkind = \"webhook\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"hook2"}; !reflect.DeepEqual(plan.Start, want) {
		t.Errorf("start %v, want %v", plan.Start, want)
	}
}

func TestLoadChangeReportsInvalidEdits(t *testing.T) {
	next := strings.Replace(reloadBase, "interval = \"1s\"", "interval = \"soon\"", 1)
	_, err := loadChange(t, reloadBase, next)
	if err == nil || !strings.Contains(err.Error(), `ingestor.toml:16: source "b": interval: must be a duration`) {
		t.Fatalf("err = %v", err)
	}
}

func TestSnakeCaseNamesEveryFixedKey(t *testing.T) {
	example := string(ExampleTOML)
	for _, v := range []any{Daemon{}, RawStore{}, Publish{}, Push{}} {
		ty := reflect.TypeOf(v)
		for i := range ty.NumField() {
			key := snakeCase(ty.Field(i).Name)
			if !strings.Contains(example, "\n"+key+" =") && !strings.Contains(example, "\n# "+key+" =") {
				t.Errorf("%s.%s: key %q is not in the example config", ty.Name(), ty.Field(i).Name, key)
			}
		}
	}
}
