package config

import (
	"fmt"
	"strings"
)

// Error is one problem in a config file, located by file and line.
type Error struct {
	// File is the path of the config file as given to Load or Parse.
	File string
	// Line is the 1-based line of the offending key, or of the table header
	// when the key is missing; 0 when no line applies.
	Line int
	// Source is the NAME of the [source.NAME] block the problem is in, or
	// empty for problems outside a source block.
	Source string
	// Key is the key the problem is about: relative to the source block for
	// source problems (e.g. "poll_url"), dotted from the top otherwise (e.g.
	// "publish.ack_timeout"). It may be empty.
	Key string
	// Msg says what is wrong. It never contains a value read from the
	// environment.
	Msg string
}

// Error formats e as `file:line: source "NAME": key: msg`, leaving out the
// parts that do not apply.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Source != "" {
		fmt.Fprintf(&b, "source %q: ", e.Source)
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in a config file, in line order. Parse and
// Load return it as their error so that all problems can be fixed at once.
type Errors []*Error

// Error joins the errors with newlines.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}
