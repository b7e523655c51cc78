package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/ingestorhq/ingestor/internal/curvekey"
)

// cmdCurveKeygen writes a new CURVE key pair: NAME.key, the secret key with
// mode 0600, and NAME.pub, the public key. It never overwrites a file and
// prints only the public key.
func cmdCurveKeygen(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("curve-keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ingestor curve-keygen NAME\n"+
			"  writes a CURVE key pair: NAME.key (secret, mode 0600) and NAME.pub (public)")
	}
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	if fs.NArg() != 1 || fs.Arg(0) == "" {
		fs.Usage()
		return 2
	}
	pub, secretPath, publicPath, err := curvekey.Generate(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "ingestor curve-keygen: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "secret key: %s (keep it private)\npublic key: %s\n%s\n", secretPath, publicPath, pub)
	return 0
}
