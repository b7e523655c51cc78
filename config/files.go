package config

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
)

// File is one config file: its name, as errors report it, and contents.
type File struct {
	Name string
	Data []byte
}

// ReadPaths reads the config files at paths, in the order given: a file
// as it is, and a directory as the files in it whose name ends in .toml,
// in lexical order, like a conf.d directory. Other files in a directory,
// its subdirectories, and names starting with "." (an editor's lock
// file, the ..data of a Kubernetes ConfigMap volume) are left out; a
// directory with no .toml file is an error.
func ReadPaths(paths []string) ([]File, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("load config: no config file given")
	}
	var files []File
	for _, p := range paths {
		names, err := configFiles(p)
		if err != nil {
			return nil, fmt.Errorf("load config: %w", err)
		}
		for _, name := range names {
			data, err := os.ReadFile(name)
			if err != nil {
				return nil, fmt.Errorf("load config: %w", err)
			}
			files = append(files, File{Name: name, Data: data})
		}
	}
	return files, nil
}

// configFiles returns p when it is a file, or the config files in p
// when it is a directory (see ReadPaths).
func configFiles(p string) ([]string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{p}, nil
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries { // sorted by name
		name := filepath.Join(p, e.Name())
		if !strings.HasSuffix(e.Name(), ".toml") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		// Stat follows a symbolic link, as a ConfigMap volume's entries are.
		if fi, err := os.Stat(name); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("the directory %s holds no *.toml file", p)
	}
	return names, nil
}

// Fingerprint returns a digest of the config at paths, as ReadPaths
// reads it: the names and contents of its files. It changes when a file
// changes, or is added to or removed from a directory.
func Fingerprint(paths []string) ([32]byte, error) {
	files, err := ReadPaths(paths)
	if err != nil {
		return [32]byte{}, err
	}
	h := sha256.New()
	for _, f := range files {
		for _, b := range [][]byte{[]byte(f.Name), f.Data} {
			_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
			h.Write(b)
		}
	}
	return [32]byte(h.Sum(nil)), nil
}

// Name names the config in messages: its paths, joined with ", "; ""
// for the embedded example.
func (c *Config) Name() string { return strings.Join(c.Paths, ", ") }

// Args returns the -c flags that load the config again, such as
// "-c /etc/ingestor/conf.d" or "-c base.toml -c sources.toml"; "" for
// the embedded example.
func (c *Config) Args() string {
	args := make([]string, len(c.Paths))
	for i, p := range c.Paths {
		args[i] = "-c " + p
	}
	return strings.Join(args, " ")
}

// blockTables are the top-level tables whose blocks may be spread over
// several files, each block in one file only, with the name their
// blocks go by in messages.
var blockTables = map[string]string{"source": "source", "rate_limiters": "rate limiter"}

// merge joins the top-level tables of the files (tops[i] is d.docs[i]'s)
// into one, recording in d.owner which file defines each table and each
// block of blockTables (those are in d.blocks). A table or block that an
// earlier file defined is reported, naming both places, and left out.
func (d *decoder) merge(tops []map[string]toml.Primitive) map[string]toml.Primitive {
	merged := map[string]toml.Primitive{}
	d.blocks = map[string]map[string]toml.Primitive{}
	for i, top := range tops {
		o := d.docs[i]
		for _, k := range slices.Sorted(maps.Keys(top)) {
			path := []string{k}
			what, isBlocks := blockTables[k]
			if !isBlocks {
				if first, dup := d.owner[k]; dup {
					d.duplicate(o, path, first, "["+k+"]",
						" (split files may each add [source.NAME] and [rate_limiters.NAME] blocks, but any other table belongs in one file)")
					continue
				}
				d.owner[k], merged[k] = o, top[k]
				continue
			}
			if _, ok := merged[k]; !ok {
				d.owner[k], merged[k] = o, top[k]
			}
			var blocks map[string]toml.Primitive
			if err := o.md.PrimitiveDecode(top[k], &blocks); err != nil {
				d.errIn(o, path, k, "must be a table, not "+tomlTypeName(o.md.Type(k)))
				continue
			}
			if d.blocks[k] == nil {
				d.blocks[k] = map[string]toml.Primitive{}
			}
			for _, name := range slices.Sorted(maps.Keys(blocks)) {
				bp := child(path, name)
				if first, dup := d.owner[pathKey(bp)]; dup {
					d.duplicate(o, bp, first, fmt.Sprintf("%s %q", what, name), "")
					continue
				}
				d.owner[pathKey(bp)], d.blocks[k][name] = o, blocks[name]
			}
		}
	}
	return merged
}

// duplicate reports that o defines path (what, in the message), which
// first defined already.
func (d *decoder) duplicate(o *doc, path []string, first *doc, what, hint string) {
	d.errIn(o, path, "", fmt.Sprintf("%s already defined at %s:%d%s", what, first.file, first.lines.lookup(path), hint))
}

// errIn records msg about key at path in the file o, which need not own
// path (a duplicate definition), and leaves path's keys in o unreported.
func (d *decoder) errIn(o *doc, path []string, key, msg string) {
	d.errs = append(d.errs, &Error{File: o.file, Line: o.lines.lookup(path), Key: key, Msg: msg})
	o.reported = append(o.reported, path)
}
