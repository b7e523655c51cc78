package config

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

var updateSchema = flag.Bool("update", false, "rewrite ingestor.schema.json from the config types (as go generate ./config does)")

const schemaFile = "ingestor.schema.json"

// TestSchemaIsCurrent fails when ingestor.schema.json is not what the
// config types and docs/configuration.md generate now: run `go generate
// ./config` (or this test with -update).
func TestSchemaIsCurrent(t *testing.T) {
	reference, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	want, err := JSONSchema(reference)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(schemaFile)
	if err != nil && !*updateSchema {
		t.Fatal(err)
	}
	if bytes.Equal(got, want) {
		return
	}
	if *updateSchema {
		if err := os.WriteFile(schemaFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s rewritten", schemaFile)
		return
	}
	t.Fatalf("%s is stale: run `go generate ./config` (or go test ./config -run TestSchemaIsCurrent -update) and commit it", schemaFile)
}

// TestSchemaGenerationNeedsEveryDescription: a key without a row in the
// reference cannot be described, and the generation says which.
func TestSchemaGenerationNeedsEveryDescription(t *testing.T) {
	reference, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	without := regexp.MustCompile("(?m)^\\| `shutdown_grace` \\|.*\n").ReplaceAll(reference, nil)
	if _, err := JSONSchema(without); err == nil || !strings.Contains(err.Error(), "key shutdown_grace of daemon has no row in the reference") {
		t.Errorf("err = %v", err)
	}
}

// compiledSchema compiles ingestor.schema.json with a JSON Schema
// validator.
func compiledSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	sch, err := jsonschema.NewCompiler().Compile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

// tomlAsJSON decodes TOML text as JSON: what an editor validates against
// the schema.
func tomlAsJSON(t *testing.T, text string) any {
	t.Helper()
	var m map[string]any
	if _, err := toml.Decode(text, &m); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// validFiles are the valid configs: both copies of the example, every
// good testdata file, each file of the split directory on its own (an
// editor checks one file at a time) and the container's config.
func validFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"../ingestor.example.toml", "ingestor.example.toml", "../deploy/ingestor.container.toml"}
	for _, pattern := range []string{"*.good.toml", "split/*.toml"} {
		m, err := filepath.Glob(filepath.Join(testdata, pattern))
		if err != nil || len(m) == 0 {
			t.Fatalf("no %s: %v", pattern, err)
		}
		files = append(files, m...)
	}
	return files
}

// TestSchemaAcceptsValidConfigs validates every valid config, as JSON,
// against the schema.
func TestSchemaAcceptsValidConfigs(t *testing.T) {
	sch := compiledSchema(t)
	for _, f := range validFiles(t) {
		if strings.HasPrefix(filepath.Base(f), ".") {
			continue // not a config: the split directory's ignored file
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(tomlAsJSON(t, string(data))); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// schemaRejects are the bad files a schema can tell: an unknown key, a
// value of the wrong type, a missing or unknown kind, a bad duration.
// Each must fail the schema.
var schemaRejects = map[string]string{
	"unknown_key.bad.toml":         "unknown key colour in a source",
	"unknown_publish_key.bad.toml": "unknown keys in [publish] and an unknown top-level table",
	"unknown_kind.bad.toml":        "kind \"rss\" is not a kind",
	"missing_kind.bad.toml":        "a source without kind",
	"bad_duration.bad.toml":        `"10 parsecs" is not a duration; timeout is an integer`,
	"bad_jitter.bad.toml":          "jitter is an integer, not a percentage string",
	"malformed_retries.bad.toml":   "malformed_retries is a string",
	"many.bad.toml":                "unknown keys, an integer as a string",
	"credentials.bad.toml":         "unknown keys access_key and aws_secret_access_key in [raw_store]",
	"push_guard.bad.toml":          "unknown key allow_cidr",
	"rate_limiters.bad.toml":       "a rate limiter without rate",
	"webhook.bad.toml":             "a secrets entry table with an unknown key, an integer entry",
	"ws_ingress.bad.toml":          `read_timeout "soon" is not a duration`,
	"syntax.bad.toml":              "not TOML at all (checked by the TOML decoder, before the schema)",
	"missing_poll_url.bad.toml":    "poll_url is required for kind http_poll",
	"bad_retention.bad.toml":       `dedupe_window "a week" is not a duration`,
	"telemetry.bad.toml":           `export_timeout "soon" is not a duration`,
}

// schemaAccepts are the bad files whose problems only the daemon sees:
// values of the right type that are out of range, inconsistent or
// unreadable. The schema accepts them; `ingestor validate` does not.
var schemaAccepts = map[string]string{
	"ack_max_message_bytes.bad.toml": "integers out of range",
	"admin_both.bad.toml":            "admin_token and admin_token_file both set",
	"admin_keys.bad.toml":            "admin_addr equal to http_addr, a short token",
	"admin_public.bad.toml":          "a public admin listener without a token",
	"admin_token_file.bad.toml":      "a token file that does not exist",
	"bad_raw_store_url.bad.toml":     "a URL of the wrong form",
	"bad_s3_url.bad.toml":            "an invalid bucket name",
	"cluster.bad.toml":               "names, URLs and bounds",
	"curve.bad.toml":                 "key files missing or malformed",
	"curve_no_secret.bad.toml":       "one CURVE key file without the other",
	"has_more.bad.toml":              "keys that need others",
	"min_free_bytes.bad.toml":        "a negative integer",
	"offline.bad.toml":               "files and variables of the target machine",
	"push.bad.toml":                  "a certificate without its key, an unauthenticated public source",
	"push_client_ca.bad.toml":        "client_ca_file without TLS",
	"push_client_ca_pem.bad.toml":    "files that are not PEM",
	"unset_env.bad.toml":             "unset variables",
	"websocket_cursor.bad.toml":      "cursor settings that contradict each other",
}

// TestSchemaClassifiesBadFiles validates every bad testdata file against
// the schema: those of schemaRejects fail it, those of schemaAccepts pass
// it (only the daemon's validation catches them), and every bad file is
// in one of the two lists.
func TestSchemaClassifiesBadFiles(t *testing.T) {
	sch := compiledSchema(t)
	all := map[string]string{}
	for name, why := range schemaRejects {
		all[name] = why
	}
	for name, why := range schemaAccepts {
		if _, dup := all[name]; dup {
			t.Errorf("%s is in both lists", name)
		}
		all[name] = why
	}
	checkTestdata(t, "*.bad.toml", all)
	for name, why := range all {
		data, err := os.ReadFile(filepath.Join(testdata, name))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if _, err := toml.Decode(string(data), &m); err != nil {
			if _, ok := schemaRejects[name]; !ok {
				t.Errorf("%s is not TOML: %v", name, err)
			}
			continue
		}
		err = sch.Validate(tomlAsJSON(t, string(data)))
		switch _, reject := schemaRejects[name]; {
		case reject && err == nil:
			t.Errorf("%s passes the schema, but %s", name, why)
		case !reject && err != nil:
			t.Errorf("%s fails the schema, which cannot see that %s: %v", name, why, err)
		}
	}
}

// TestSchemaCases checks the schema's rules one at a time: each snippet
// passes or fails as the daemon's decoder would decide on its keys and
// types.
func TestSchemaCases(t *testing.T) {
	sch := compiledSchema(t)
	for _, tc := range []struct {
		name, toml string
		ok         bool
	}{
		{"empty file", "", true},
		{"an ${ENV} string", "[daemon]\nadmin_token = \"${TOKEN}\"\n", true},
		{"an ${ENV} duration", "[daemon]\nshutdown_grace = \"${GRACE}\"\n", true},
		{"a duration", "[publish]\nack_timeout = \"1m30s\"\n", true},
		{"a duration in a source kind", "[source.s]\nkind = \"websocket\"\nurl = \"wss://x/\"\nping_interval = \"20s\"\n", true},
		{"a bad duration in a source kind", "[source.s]\nkind = \"websocket\"\nurl = \"wss://x/\"\nping_interval = \"often\"\n", false},
		{"retention 0", "[raw_store]\nretention = \"0\"\n", true},
		{"a percentage", "[defaults]\njitter = \"12.5%\"\n", true},
		{"a number for a percentage", "[defaults]\njitter = 0.1\n", false},
		{"an integer as a string", "[publish]\nhigh_water_mark = \"1000\"\n", false},
		{"an ${ENV} integer", "[publish]\nhigh_water_mark = \"${HWM}\"\n", false},
		{"a key of another kind", "[source.s]\nkind = \"demo\"\npoll_url = \"https://x/\"\n", false},
		{"a key of its kind", "[source.s]\nkind = \"http_poll\"\npoll_url = \"https://x/\"\n", true},
		{"a common key", "[source.s]\nkind = \"sse\"\nurl = \"https://x/\"\ninterval = \"5s\"\nenabled = false\n", true},
		{"an oauth2 table", "[source.s]\nkind = \"http_poll\"\npoll_url = \"https://x/\"\noauth2 = { token_url = \"https://x/t\", client_id = \"c\" }\n", true},
		{"an oauth2 typo", "[source.s]\nkind = \"http_poll\"\npoll_url = \"https://x/\"\noauth2 = { token_urll = \"https://x/t\" }\n", false},
		{"secrets as strings and tables", "[source.w]\nkind = \"webhook\"\nsignature = \"github\"\nsecrets = [\"a\", { value = \"b\", not_after = \"2026-01-01T00:00:00Z\" }]\n", true},
		{"a header table", "[source.s]\nkind = \"http_poll\"\npoll_url = \"https://x/\"\nheaders = { X-Anything = \"v\" }\n", true},
		{"a header of the wrong type", "[source.s]\nkind = \"http_poll\"\npoll_url = \"https://x/\"\nheaders = { X-Count = 1 }\n", false},
		{"an invalid source name", "[source.\"bad name\"]\nkind = \"demo\"\n", false},
		{"an unknown table", "[tracing]\nendpoint = \"x\"\n", false},
		{"tracing on", "[telemetry]\nendpoint = \"http://127.0.0.1:4317\"\nsampling_ratio = 0.5\n", true},
		{"a string for a ratio", "[telemetry]\nsampling_ratio = \"50%\"\n", false},
		{"a rate limiter", "[rate_limiters.gh]\nrate = \"10/s\"\nburst = 5\n", true},
		{"an array of endpoints", "[cluster]\netcd_endpoints = [\"https://a:2379\", \"https://b:2379\"]\n", true},
		{"a string for an array", "[cluster]\netcd_endpoints = \"https://a:2379\"\n", false},
	} {
		err := sch.Validate(tomlAsJSON(t, tc.toml))
		if (err == nil) != tc.ok {
			t.Errorf("%s: valid = %v, want %v: %v\n%s", tc.name, err == nil, tc.ok, err, tc.toml)
		}
	}
}
