"""`make test` and `.ci/run` make sure Debian's redis-server is there (the shared-tier
tests start one): the check runs before the tests, and without the binary and without
root it fails with a message naming the package."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "ensure_redis.sh"


def test_make_test_and_ci_run_check_for_redis_server():
    dry = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    check = dry.index("bash scripts/ensure_redis.sh")
    assert check < next(i for i, line in enumerate(dry) if "pytest" in line)
    assert "bash scripts/ensure_redis.sh" in (REPO / ".ci" / "run").read_text()


def test_without_redis_server_and_root_it_names_the_package(tmp_path):
    fake_id = tmp_path / "id"
    fake_id.write_text("#!/bin/sh\necho 1000\n")
    fake_id.chmod(0o755)
    r = subprocess.run(["/bin/bash", str(SCRIPT)], env={"PATH": str(tmp_path)},
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "install the Debian package redis-server" in r.stderr
