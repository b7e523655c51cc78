// Package treecheck holds the check that the repository tracks only code
// written for the project: no built binary (an ELF file), no file over
// MaxFileBytes, and no third-party source brought in by copying (a
// licence or notice file below the root, a vendor/ or third_party/
// directory). Third-party code comes in as a Go module, a Debian package
// or an npm package; see docs/development.md. The check is a
// test, so `make test` fails, naming the file, when one comes back.
package treecheck

// MaxFileBytes is the largest tracked file the check allows: 2 MB. Test
// data, docs and source stay far below it; a file this big is a built
// artefact, a dump or a copied archive.
const MaxFileBytes = 2_000_000
