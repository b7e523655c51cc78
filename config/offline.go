package config

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/ingestorhq/ingestor/sources"
)

// Skipped is one thing an offline check (Options.Offline) left
// unchecked because only the machine the daemon runs on has it: a
// ${NAME} whose variable is not set, or a file that a key names (a CURVE
// key, a token, a certificate), which was not read.
type Skipped struct {
	// File and Line locate the key in the config, as Error does.
	File string
	Line int
	// Source is the NAME of the [source.NAME] block the key is in, or
	// empty; Key is relative to it, or dotted from the top otherwise.
	Source string
	Key    string
	// Env is the variable of a ${NAME} reference that is not set; empty
	// for a file.
	Env string
	// Path is the file the key names, not read; empty for a ${NAME}.
	Path string
}

// String formats s as `file:line: key: ${NAME} is not set` or
// `file:line: key: file not read: PATH`.
func (s Skipped) String() string {
	msg := "${" + s.Env + "} is not set"
	if s.Env == "" {
		msg = "file not read: " + s.Path
	}
	return (&Error{File: s.File, Line: s.Line, Source: s.Source, Key: s.Key, Msg: msg}).Error()
}

// SkippedSummary counts what an offline check skipped, such as
// "3 ${ENV} references, 2 key files".
func (c *Config) SkippedSummary() string {
	env := 0
	for _, s := range c.Skipped {
		if s.Env != "" {
			env++
		}
	}
	return fmt.Sprintf("%s, %s", plural(env, "${ENV} reference"), plural(len(c.Skipped)-env, "key file"))
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// skip notes that the value at path references the unset variables
// names, which an offline check leaves for the target machine to set:
// the value is left unchecked.
func (d *decoder) skip(path []string, names ...string) {
	d.unchecked[pathKey(path)] = true
	for _, name := range names {
		d.skipped = append(d.skipped, d.skippedAt(path, name, ""))
	}
}

// readsFile reports whether the file that the key at path names (file,
// not empty) may be read: always, but for an offline check, which notes
// it as skipped instead.
func (d *decoder) readsFile(path []string, file string) bool {
	if !d.offline {
		return true
	}
	d.skipped = append(d.skipped, d.skippedAt(path, "", file))
	return false
}

// readsKeyPair is readsFile for a certificate and its key, both set.
func (d *decoder) readsKeyPair(certPath []string, cert string, keyPath []string, key string) bool {
	c, k := d.readsFile(certPath, cert), d.readsFile(keyPath, key)
	return c && k
}

func (d *decoder) skippedAt(path []string, env, file string) Skipped {
	e := d.newError(path, "")
	return Skipped{File: e.File, Line: e.Line, Source: e.Source, Key: e.Key, Env: env, Path: file}
}

// isUnchecked reports whether path, or the value holding it, references
// a variable an offline check left unset.
func (d *decoder) isUnchecked(path []string) bool {
	for n := len(path); n > 0; n-- {
		if d.unchecked[pathKey(path[:n])] {
			return true
		}
	}
	return false
}

// skippedFiles notes, for an offline check, the files of a source's spec
// that it did not read: unread holds their keys, relative to the block
// at path, whose values are the spec's fields named by those keys.
func (d *decoder) skippedFiles(path []string, targets []any, unread []string) {
	fs := fields(targets...)
	for _, key := range unread {
		kp := child(path, strings.Split(key, ".")...)
		file := ""
		if f, ok := fs[key]; ok && f.Kind() == reflect.String {
			file = f.String()
		}
		d.skipped = append(d.skipped, d.skippedAt(kp, "", file))
	}
}

// validateSpec validates the spec of the source block at path (decoded
// from targets); offline, a spec that reads files does not, and notes
// them as skipped.
func (d *decoder) validateSpec(path []string, spec sources.Spec, targets []any) []sources.FieldError {
	os, ok := spec.(sources.OfflineSpec)
	if !d.offline || !ok {
		return spec.Validate()
	}
	problems, unread := os.ValidateOffline()
	d.skippedFiles(path, targets, unread)
	return problems
}
