package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// duration is a TOML duration string such as "30s", parsed during
// validation so that a bad one is reported without stopping the decode.
type duration string

// percent is a TOML percentage string such as "10%".
type percent string

// decoder holds the state of one Parse: the decoded documents (one per
// file), their line indexes, and every problem found so far.
type decoder struct {
	// docs are the files, in the order given.
	docs []*doc
	// owner maps each top-level table, and each [source.NAME] and
	// [rate_limiters.NAME] block (as pathKey of its path), to the file
	// that defines it: each is defined in one file only.
	owner map[string]*doc
	// blocks holds the blocks of each of blockTables, from every file.
	blocks map[string]map[string]toml.Primitive
	lookup func(string) (string, bool)
	// offline leaves unchecked what needs the machine the daemon runs on:
	// unset ${NAME} and the files that keys name (see Options.Offline).
	offline bool
	// skipped is what an offline parse left unchecked, and unchecked the
	// paths of the values it could not check (an unset ${NAME}): no
	// problem is reported at them.
	skipped   []Skipped
	unchecked map[string]bool
	errs      Errors
	// flagged holds the paths that already have an error, or whose contents
	// cannot be checked (a source of unknown kind); their descendants are not
	// reported again.
	flagged map[string]bool
	// raw holds the text of values changed by ${ENV} interpolation, so that
	// messages quote the file, never the environment.
	raw map[string]string
}

func pathKey(path []string) string { return strings.Join(path, pathSep) }

// child returns path extended by key, never sharing path's backing array.
func child(path []string, key ...string) []string {
	return append(slices.Clip(path), key...)
}

// errAt records a problem about the key at path (a full TOML path such as
// source.NAME.poll_url), at that key's line or, when the key is absent from
// the file, at its table header. A path keeps only its first error.
func (d *decoder) errAt(path []string, format string, args ...any) {
	k := pathKey(path)
	if d.flagged[k] || d.isUnchecked(path) {
		return
	}
	d.flagged[k] = true
	d.errs = append(d.errs, d.newError(path, fmt.Sprintf(format, args...)))
}

// doc is one config file being decoded.
type doc struct {
	file  string
	md    toml.MetaData
	lines lineIndex
	// reported are the paths of tables this file defines that were
	// reported as a whole (defined in an earlier file too): their keys
	// are not reported again.
	reported [][]string
}

// hides reports whether path is in a table o reported as a whole.
func (o *doc) hides(path []string) bool {
	return slices.ContainsFunc(o.reported, func(r []string) bool {
		return len(path) >= len(r) && slices.Equal(path[:len(r)], r)
	})
}

// docOf returns the file that defines path: the one that owns its
// [source.NAME] or [rate_limiters.NAME] block, or its top-level table;
// the first file for a path no file owns.
func (d *decoder) docOf(path []string) *doc {
	for n := min(len(path), 2); n > 0; n-- {
		if o, ok := d.owner[pathKey(path[:n])]; ok {
			return o
		}
	}
	return d.docs[0]
}

// line returns the line of path in the file that defines it.
func (d *decoder) line(path []string) int { return d.docOf(path).lines.lookup(path) }

// newError locates msg at path.
func (d *decoder) newError(path []string, msg string) *Error {
	o := d.docOf(path)
	e := &Error{File: o.file, Line: o.lines.lookup(path), Msg: msg}
	if len(path) >= 2 && path[0] == "source" {
		e.Source = path[1]
		e.Key = toml.Key(path[2:]).String()
	} else {
		e.Key = toml.Key(path).String()
	}
	return e
}

// covered reports whether path or one of its parents already has an error.
func (d *decoder) covered(path []string) bool {
	for n := len(path); n > 0; n-- {
		if d.flagged[pathKey(path[:n])] {
			return true
		}
	}
	return false
}

// show quotes the value at path for a message: the file's text when the value
// came from the environment, so that secrets never reach an error.
func (d *decoder) show(path []string, v string) string {
	if r, ok := d.raw[pathKey(path)]; ok {
		return strconv.Quote(r)
	}
	return strconv.Quote(v)
}

// table splits the table at path into its keys, or reports that the value
// there is not a table.
func (d *decoder) table(prim toml.Primitive, path []string) (map[string]toml.Primitive, bool) {
	var m map[string]toml.Primitive
	if err := d.docOf(path).md.PrimitiveDecode(prim, &m); err != nil {
		d.errAt(path, "must be a table, not %s", d.tomlType(path))
		return nil, false
	}
	return m, true
}

// fields maps the toml tag of every field of the structs that targets point
// to onto the field; the first target wins a name. The fields of an
// embedded struct count as the outer struct's own (sources.PushGuard's
// keys are written in the source block), as BurntSushi/toml has them.
func fields(targets ...any) map[string]reflect.Value {
	out := map[string]reflect.Value{}
	for _, t := range targets {
		v := reflect.ValueOf(t)
		if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
			continue
		}
		v = v.Elem()
		for _, f := range reflect.VisibleFields(v.Type()) {
			name := tagName(f)
			if _, dup := out[name]; name != "" && !dup {
				out[name] = v.FieldByIndex(f.Index)
			}
		}
	}
	return out
}

// tagName returns the TOML key of a struct field: its toml tag, or "" when
// the field is unexported, has none or is an embedded struct (whose own
// fields are the keys).
func tagName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if !f.IsExported() || name == "-" || f.Anonymous && name == "" {
		return ""
	}
	return name
}

// decodeKeys decodes the keys of table m (at path) one at a time into the
// fields of targets, so that a value of the wrong type is reported at its
// line without hiding the other keys. Keys are matched exactly (the toml
// package would also match them ignoring case). A key no target has is an
// unknown key, unless strict is false (a source of unknown kind), in which
// case it is left unchecked. It returns the keys present.
func (d *decoder) decodeKeys(m map[string]toml.Primitive, path []string, strict bool, targets ...any) map[string]bool {
	fs := fields(targets...)
	present := map[string]bool{}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		kp := child(path, k)
		f, ok := fs[k]
		switch {
		case !ok && strict:
			d.unknown(kp)
		case !ok:
			d.flagged[pathKey(kp)] = true
		default:
			present[k] = true
			d.decodeValue(m[k], kp, f)
		}
	}
	return present
}

// decodeValue decodes prim, the value at path, into v, which must be
// settable. A map is decoded entry by entry, so that a bad entry is reported
// at its own key.
func (d *decoder) decodeValue(prim toml.Primitive, path []string, v reflect.Value) {
	if v.Kind() == reflect.Map && v.Type().Key().Kind() == reflect.String {
		var m map[string]toml.Primitive
		if err := d.docOf(path).md.PrimitiveDecode(prim, &m); err != nil {
			d.errAt(path, "must be %s, not %s", describe(v.Type()), d.tomlType(path))
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			elem := reflect.New(v.Type().Elem()).Elem()
			d.decodeValue(m[k], child(path, k), elem)
			v.SetMapIndex(reflect.ValueOf(k).Convert(v.Type().Key()), elem)
		}
		return
	}
	if err := d.docOf(path).md.PrimitiveDecode(prim, v.Addr().Interface()); err != nil {
		d.errAt(path, "must be %s, not %s", describe(v.Type()), d.tomlType(path))
	}
}

// credentialWords mark a [raw_store] key as an attempt to put S3
// credentials in the file.
var credentialWords = []string{"access_key", "secret", "token", "password", "credential"}

// unknown reports the key at path as unknown.
func (d *decoder) unknown(path []string) {
	if len(path) == 2 && path[0] == "raw_store" {
		lower := strings.ToLower(path[1])
		for _, w := range credentialWords {
			if strings.Contains(lower, w) {
				d.errAt(path, "credentials do not belong in the config file; "+
					"use the standard AWS environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) "+
					"or credential chain (AWS_PROFILE, shared credentials file, instance role)")
				return
			}
		}
	}
	d.errAt(path, "unknown key")
}

// undecoded reports every key the decode did not consume and that no earlier
// error covers: what is left after all tables have been decoded. A key of
// a table that another file defines first was reported as a duplicate.
func (d *decoder) undecoded() {
	for _, o := range d.docs {
		for _, k := range o.md.Undecoded() {
			if !o.hides(k) && !d.covered(k) {
				d.unknown(k)
			}
		}
	}
}

// tomlType names the TOML type of the value at path, for messages.
func (d *decoder) tomlType(path []string) string {
	return tomlTypeName(d.docOf(path).md.Type(path...))
}

// tomlTypeName names the TOML type t (as MetaData.Type has it), for
// messages.
func tomlTypeName(t string) string {
	switch t {
	case "Hash":
		return "a table"
	case "ArrayHash":
		return "an array of tables"
	case "Bool":
		return "a boolean"
	case "":
		return "something else"
	case "Integer", "Array":
		return "an " + strings.ToLower(t)
	default:
		return "a " + strings.ToLower(t)
	}
}

// describe names what a field of type t accepts, for messages.
func describe(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[duration]():
		return `a duration string such as "30s"`
	case reflect.TypeFor[percent]():
		return `a percentage string such as "10%"`
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Map:
		return "a table of " + strings.TrimPrefix(strings.TrimPrefix(describe(t.Elem()), "a "), "an ") + "s"
	case reflect.Slice, reflect.Array:
		return "an array of " + strings.TrimPrefix(strings.TrimPrefix(describe(t.Elem()), "a "), "an ") + "s"
	case reflect.Struct:
		return "a table"
	}
	return t.String()
}

// interpolate expands ${ENV} in every string held by the present keys of
// targets, the decoded form of the table at path.
func (d *decoder) interpolate(path []string, present map[string]bool, targets ...any) {
	fs := fields(targets...)
	for _, k := range slices.Sorted(maps.Keys(present)) {
		if f, ok := fs[k]; ok && !d.covered(child(path, k)) {
			d.expandValue(child(path, k), f)
		}
	}
}

// expandValue expands ${ENV} in v, the value at path, and in everything it
// holds: strings, maps with string keys, slices and tagged struct fields.
func (d *decoder) expandValue(path []string, v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		s, problems, unset := expandEnv(v.String(), d.lookup)
		if d.offline && len(unset) > 0 {
			// Left as written, and unchecked: offline, an unset variable
			// is the target machine's to set.
			d.skip(path, unset...)
			return
		}
		for _, name := range unset {
			problems = append(problems, "environment variable "+name+" is not set")
		}
		// A value may reference several unset variables: report each.
		for _, p := range problems {
			d.errs = append(d.errs, d.newError(path, p))
			d.flagged[pathKey(path)] = true
		}
		if len(problems) == 0 && s != v.String() {
			d.raw[pathKey(path)] = v.String()
			v.SetString(s)
		}
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return
		}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		for _, k := range keys {
			elem := reflect.New(v.Type().Elem()).Elem()
			elem.Set(v.MapIndex(k))
			d.expandValue(child(path, k.String()), elem)
			v.SetMapIndex(k, elem)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			d.expandValue(path, v.Index(i))
		}
	case reflect.Struct:
		for _, f := range reflect.VisibleFields(v.Type()) {
			if name := tagName(f); name != "" {
				d.expandValue(child(path, name), v.FieldByIndex(f.Index))
			}
		}
	case reflect.Pointer:
		if !v.IsNil() {
			d.expandValue(path, v.Elem())
		}
	}
}
