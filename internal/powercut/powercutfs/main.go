// Command powercutfs serves a power-cut file system (package powercut) in
// a process of its own, for tests: serving FUSE from the process that
// also uses the mount (SQLite's mmap, fork and exec) can deadlock the Go
// runtime. powercut.NewDisk builds and runs it.
//
//	powercutfs -mount DIR -backing DIR -state DIR
//
// It prints "mounted" once the FS is mounted, then reads commands, one a
// line, on standard input and answers each on standard output: "cut"
// cuts the power (answer "cut"), "unmount" unmounts, rebuilding the
// backing directory from what was durable if the power was cut (answer
// "unmounted"), and exits. A command that fails is answered "error: "
// and why. At the end of standard input it unmounts as "unmount" does.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"

	"github.com/ingestorhq/ingestor/internal/powercut"
)

func main() {
	mount := flag.String("mount", "", "the mount point")
	backing := flag.String("backing", "", "the backing directory")
	state := flag.String("state", "", "a directory of the FS's own, on the backing directory's file system")
	flag.Parse()
	if *mount == "" || *backing == "" || *state == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	fsys, err := powercut.Mount(*mount, *backing, *state)
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("mounted")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch cmd := in.Text(); cmd {
		case "cut":
			fsys.Cut()
			fmt.Println("cut")
		case "unmount":
			unmount(fsys)
			return
		default:
			fmt.Printf("error: unknown command %q\n", cmd)
		}
	}
	unmount(fsys)
}

// unmount unmounts fsys, answers, and exits non-zero if that failed.
func unmount(fsys *powercut.FS) {
	if err := fsys.Unmount(); err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("unmounted")
}
