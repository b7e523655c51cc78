"""Tests of the package as pip installs it. go test ./clients/python
installs it into a fresh virtual environment, names that environment in
INGESTOR_TEST_VENV and runs this suite with its interpreter from a copy of
the tests folder, so that the package under test is the installed one, not
the source folder. Run without INGESTOR_TEST_VENV, these tests fail rather
than skip."""

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import unittest
from pathlib import Path

import ingestor_processor as ip

SCRIPT = "ingestor-processor-py"


class InstalledTest(unittest.TestCase):
    def setUp(self):
        venv = os.environ.get("INGESTOR_TEST_VENV")
        if not venv:
            self.fail("INGESTOR_TEST_VENV is not set: go test ./clients/python installs the package into a "
                      "virtual environment and runs these tests there")
        self.venv = Path(venv).resolve()

    def test_imported_from_the_venv(self):
        self.assertEqual(Path(sys.prefix).resolve(), self.venv, "the tests do not run on the venv's interpreter")
        site = Path(sysconfig.get_paths()["purelib"]).resolve()
        self.assertTrue(site.is_relative_to(self.venv), f"{site} is not the venv's site-packages")
        self.assertEqual(Path(ip.__file__).resolve(), site / "ingestor_processor" / "__init__.py",
                         "ingestor_processor is not imported from the venv's site-packages")

    def test_metadata(self):
        dist = importlib.metadata.distribution("ingestor-processor")
        self.assertEqual(dist.version, ip.__version__)
        self.assertEqual(dist.requires, ["pyzmq"])
        scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
        self.assertEqual(scripts, {SCRIPT: "ingestor_processor.__main__:console_script"})
        # Besides its metadata and the script (under ../../../bin), only the package.
        packages = {f.parts[0] for f in dist.files if f.parts[0] != ".." and not f.parts[0].endswith(".dist-info")}
        self.assertEqual(packages, {"ingestor_processor"}, "the wheel installs more than the package (its tests?)")

    def run_script(self, *args):
        return subprocess.run([str(self.venv / "bin" / SCRIPT), *args], capture_output=True, text=True, timeout=60)

    def test_console_script_help(self):
        out = self.run_script("--help")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.startswith(f"usage: {SCRIPT} "), out.stdout)
        for flag in ("--sqlite", "--connect", "--ack", "--fail-keys", "--etcd", "--member"):
            self.assertIn(flag, out.stdout)

    def test_console_script_version(self):
        out = self.run_script("--version")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout, f"{SCRIPT} {ip.__version__}\n")

    def test_console_script_wants_sqlite(self):
        out = self.run_script()
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn(f"{SCRIPT}: error: the following arguments are required: --sqlite", out.stderr)
