package config

import "slices"

// topTable is a top-level table of the daemon's file.
type topTable struct {
	name string
	// keys returns the struct the table's keys decode into (a block's,
	// for blocks), holding the defaults of its keys; a default derived
	// from another setting (raw_store's url from daemon.data_dir) is left
	// empty.
	keys func() any
	// blocks marks a table of NAME blocks: [source.NAME] (which also take
	// the keys of their kind) and [rate_limiters.NAME].
	blocks bool
}

// topTables are the top-level tables of the daemon's file. parse takes no
// other top-level key, and the JSON Schema (JSONSchema, written to
// ingestor.schema.json by `go generate ./config`) is generated from them:
// a new section is its decode function in parse, a line here, a table of
// docs/configuration.md (whose descriptions the schema takes), and the
// keys in ingestor.example.toml.
var topTables = []topTable{
	{name: "daemon", keys: func() any { return daemonDefaults() }},
	{name: "raw_store", keys: func() any {
		t := rawStoreDefaults("")
		t.URL, t.SpillDir = "", ""
		return t
	}},
	{name: "publish", keys: func() any { return publishDefaults() }},
	{name: "push", keys: func() any { return pushDefaults() }},
	{name: "cluster", keys: func() any { return clusterDefaults() }},
	{name: "telemetry", keys: func() any { return telemetryDefaults() }},
	{name: "defaults", keys: func() any { return defaultsDefaults() }},
	{name: "rate_limiters", keys: func() any { return rateLimiterDefaults() }, blocks: true},
	{name: "source", keys: func() any { return sourceKeysDefaults() }, blocks: true},
}

// isTopTable reports whether name is one of topTables.
func isTopTable(name string) bool {
	return slices.ContainsFunc(topTables, func(t topTable) bool { return t.name == name })
}
