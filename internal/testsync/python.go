package testsync

import (
	"os"
	"os/exec"
	"testing"
)

// Python3 returns the Python interpreter that has pyzmq, for the tests
// that run Python processors: $PYTHON3 (make test sets it), else
// /usr/bin/python3, where Debian's python3-zmq installs (the first python3
// on PATH may be another one). A missing pyzmq fails t, never skips it:
// make test installs python3-zmq.
func Python3(t testing.TB) string {
	t.Helper()
	py := os.Getenv("PYTHON3")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import zmq").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import zmq (%v: %s); run make test, which installs python3-zmq, or set PYTHON3", py, err, out)
	}
	return py
}
