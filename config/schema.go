package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/ingestorhq/ingestor/sources"
)

//go:generate go run ./schemagen -doc ../docs/configuration.md -out ingestor.schema.json

// Patterns of the string values the decoder parses itself. A value
// holding a ${NAME} reference is accepted as it is: the variable's value
// is checked when the daemon loads the file.
const (
	durationPattern = `^(.*\$\{.*|[-+]?(0|([0-9]*\.?[0-9]+(ns|us|µs|ms|s|m|h))+))$`
	percentPattern  = `^(.*\$\{.*|\s*[0-9]*\.?[0-9]+\s*%\s*)$`
	namePattern     = `^[a-zA-Z0-9_-]+$`
)

// obj is a JSON object of the schema.
type obj = map[string]any

// JSONSchema returns the JSON Schema (draft 7) of the daemon's config
// file, generated from the structs its tables decode into (topTables) and
// the kinds' Specs: every key with its type and default, unknown keys
// refused (additionalProperties: false), and each [source.NAME] block
// checked against the keys of its kind (if/then on kind). Each key's
// description is its row in reference, the text of
// docs/configuration.md; a key without one is an error. `go generate
// ./config` writes it to ingestor.schema.json.
func JSONSchema(reference []byte) ([]byte, error) {
	doc := string(reference)
	g := &schemaGen{rows: referenceRows(doc)}
	props, defs := obj{}, obj{}
	for _, t := range topTables {
		intro := sectionIntro(doc, t.name)
		switch {
		case t.name == "source":
			defs[t.name] = g.source(t.keys())
		case t.blocks:
			defs[t.name] = g.table(t.name, t.keys())
		default:
			props[t.name] = g.table(t.name, t.keys())
			props[t.name].(obj)["description"] = intro
			continue
		}
		props[t.name] = obj{"type": "object", "description": intro,
			"propertyNames":        obj{"pattern": namePattern},
			"additionalProperties": obj{"$ref": "#/definitions/" + t.name}}
	}
	if len(g.errs) > 0 {
		return nil, fmt.Errorf("generate the config's JSON Schema: %w", errors.Join(g.errs...))
	}
	root := obj{
		"$schema": "http://json-schema.org/draft-07/schema#",
		"title":   "ingestor configuration",
		"description": "The daemon's config file (ingestor run -c FILE), or one file of a split config. " +
			"Generated from the config package by `go generate ./config`: do not edit.",
		"type":                 "object",
		"additionalProperties": false,
		"properties":           props,
		"definitions":          defs,
	}
	out, err := json.MarshalIndent(root, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("generate the config's JSON Schema: %w", err)
	}
	return append(out, '\n'), nil
}

// schemaGen builds a schema, collecting the keys it cannot describe.
type schemaGen struct {
	rows map[string]map[string]referenceRow
	errs []error
}

// table is the schema of a table whose keys are the fields of v (holding
// their defaults), described by the reference table docTable.
func (g *schemaGen) table(docTable string, v any) obj {
	props, required := g.properties(docTable, v)
	o := obj{"type": "object", "additionalProperties": false, "properties": props}
	if len(required) > 0 {
		o["required"] = required
	}
	return o
}

// properties returns the schema of each key of v, the keys whose default
// the reference says is "required".
func (g *schemaGen) properties(docTable string, v any) (obj, []string) {
	rv := reflect.ValueOf(v)
	props := obj{}
	var required []string
	for _, f := range reflect.VisibleFields(rv.Type()) {
		key := tagName(f)
		if key == "" {
			continue
		}
		row, ok := g.rows[docTable][key]
		if !ok {
			g.errs = append(g.errs, fmt.Errorf("key %s of %s has no row in the reference", key, docTable))
		}
		s := g.value(docTable, key, f.Type, row.typ)
		s["description"] = row.description()
		if def, ok := defaultValue(rv.FieldByIndex(f.Index)); ok {
			s["default"] = def
		}
		props[key] = s
		if row.def == "required" {
			required = append(required, key)
		}
	}
	return props, required
}

// unmarshaler is toml.Unmarshaler: a type that decodes itself.
var unmarshaler = reflect.TypeFor[toml.Unmarshaler]()

// value is the schema of a value of type t, the key key of docTable, whose
// type the reference names docType.
func (g *schemaGen) value(docTable, key string, t reflect.Type, docType string) obj {
	switch {
	case t == reflect.TypeFor[duration]() || strings.HasPrefix(docType, "duration"):
		return obj{"type": "string", "pattern": durationPattern}
	case t == reflect.TypeFor[percent]() || docType == "percentage":
		return obj{"type": "string", "pattern": percentPattern}
	case t.Kind() == reflect.Struct && reflect.PointerTo(t).Implements(unmarshaler):
		// Such a struct (a webhook's secrets entry) is written as a
		// string or as a table of its keys.
		return obj{"anyOf": []any{obj{"type": "string"}, g.table(g.nested(docTable, key), reflect.New(t).Elem().Interface())}}
	}
	switch t.Kind() {
	case reflect.String:
		return obj{"type": "string"}
	case reflect.Bool:
		return obj{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return obj{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return obj{"type": "number"}
	case reflect.Map:
		if t.Key().Kind() == reflect.String {
			return obj{"type": "object", "additionalProperties": g.value(docTable, key, t.Elem(), "")}
		}
	case reflect.Slice, reflect.Array:
		return obj{"type": "array", "items": g.value(docTable, key, t.Elem(), "")}
	case reflect.Pointer:
		if t.Elem().Kind() == reflect.Struct {
			return g.table(g.nested(docTable, key), reflect.New(t.Elem()).Elem().Interface())
		}
	}
	g.errs = append(g.errs, fmt.Errorf("key %s of %s: no JSON Schema for Go type %s", key, docTable, t))
	return obj{}
}

// nested names the reference table of the nested table key of docTable:
// docTable.key (kind.webhook.secrets) or, for a table several kinds take,
// kind.key (kind.oauth2).
func (g *schemaGen) nested(docTable, key string) string {
	if _, ok := g.rows[docTable+"."+key]; ok {
		return docTable + "." + key
	}
	if _, ok := g.rows["kind."+key]; !ok {
		g.errs = append(g.errs, fmt.Errorf("the table %s of %s has no <!-- keys: %s.%s --> or kind.%s table in the reference", key, docTable, docTable, key, key))
	}
	return "kind." + key
}

// source is the schema of a [source.NAME] block: a kind among
// sources.Kinds, and for each kind (if/then) its keys and the common ones
// (common holds their defaults), nothing else. Its properties list every
// key of every kind, described, for editors to complete and explain.
func (g *schemaGen) source(common any) obj {
	kinds := sources.Kinds()
	all := obj{}
	var allOf []any
	for _, kind := range kinds {
		spec, _ := sources.NewSpec(kind)
		props, required := g.properties("source", common)
		kindProps, kindRequired := g.properties("kind."+kind, reflect.ValueOf(spec).Elem().Interface())
		for k, v := range kindProps {
			props[k] = v
		}
		props["kind"] = obj{"const": kind}
		then := obj{"properties": props, "additionalProperties": false}
		if req := slices.DeleteFunc(append(required, kindRequired...), func(k string) bool { return k == "kind" }); len(req) > 0 {
			then["required"] = req
		}
		allOf = append(allOf, obj{"if": obj{"properties": obj{"kind": obj{"const": kind}}, "required": []string{"kind"}}, "then": then})
		for k, v := range props {
			if _, ok := all[k]; !ok {
				all[k] = obj{"description": v.(obj)["description"]}
			}
		}
	}
	kindRow := g.rows["source"]["kind"]
	all["kind"] = obj{"type": "string", "enum": kinds, "description": kindRow.description()}
	return obj{"type": "object", "required": []string{"kind"}, "properties": all, "allOf": allOf}
}

// defaultValue returns v, a key's default, unless it is the zero value
// (no default, or an empty one).
func defaultValue(v reflect.Value) (any, bool) {
	if v.IsZero() || (v.Kind() == reflect.Map || v.Kind() == reflect.Slice) && v.Len() == 0 {
		return nil, false
	}
	return v.Interface(), true
}

// referenceRow is a key's row in a table of docs/configuration.md.
type referenceRow struct{ typ, def, desc string }

// markdownLink matches a Markdown link, whose text descriptions keep.
var markdownLink = regexp.MustCompile(`\[([^\]]+)\]\([^)]*\)`)

// description is the row's description and default, as the schema's
// description of the key.
func (r referenceRow) description() string {
	desc := markdownLink.ReplaceAllString(r.desc, "$1")
	switch r.def {
	case "", "—", "-":
		return desc
	case "required":
		return desc + " Required."
	}
	return desc + " Default: " + markdownLink.ReplaceAllString(r.def, "$1") + "."
}

// referenceRows returns the rows of each table of the reference: the
// Markdown table after each "<!-- keys: NAME -->" marker, by NAME, then by
// key.
func referenceRows(doc string) map[string]map[string]referenceRow {
	marker := regexp.MustCompile(`^<!-- keys: ([a-z0-9_.]+) -->$`)
	row := regexp.MustCompile("^\\| `([a-z0-9_]+)` \\| (.*) \\| (.*) \\| (.*) \\|$")
	tables := map[string]map[string]referenceRow{}
	table := ""
	for _, line := range strings.Split(doc, "\n") {
		if m := marker.FindStringSubmatch(line); m != nil {
			table = m[1]
			tables[table] = map[string]referenceRow{}
			continue
		}
		if table == "" {
			continue
		}
		if m := row.FindStringSubmatch(line); m != nil {
			tables[table][m[1]] = referenceRow{typ: m[2], def: m[3], desc: m[4]}
		} else if !strings.HasPrefix(line, "|") {
			table = ""
		}
	}
	return tables
}

// sectionIntro returns the first paragraph under the reference's heading
// of the table name ("### `[name]`" or "### `[name.NAME]`"), links
// reduced to their text.
func sectionIntro(doc, name string) string {
	_, rest, ok := strings.Cut(doc, "\n### `["+name)
	if !ok {
		return ""
	}
	_, rest, _ = strings.Cut(rest, "\n\n")
	para, _, _ := strings.Cut(rest, "\n\n")
	if strings.HasPrefix(para, "<!--") || strings.HasPrefix(para, "|") {
		return ""
	}
	return markdownLink.ReplaceAllString(strings.Join(strings.Fields(para), " "), "$1")
}
