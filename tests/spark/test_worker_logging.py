"""Lines logged in Spark's Python workers (which have no logging configured)
carry a timestamp, like the driver's: the source's planning warning, in a
fresh interpreter."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.subprocess
def test_source_retention_warning_in_a_fresh_worker_has_a_timestamp():
    code = ("from bridge.spark.source import _ranges\n"
            "print(_ranges({'0': 5}, {'0': 20}, [10], False))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if "deleted by retention" in ln]
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING bridge\.spark\.source: lakegate source: "
                    r"partition 0 offsets \[5, 10\) were deleted by retention; skipping them$", line), line
