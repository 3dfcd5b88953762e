"""The analyst notebooks run headless, every cell, against data a fixture writes.

They run as docs/tables.md says to run them: the kernel's working directory is
``notebooks/`` (Jupyter started at the project root, or ``jupyter nbconvert
--execute notebooks/...``), no ``LAKEGATE_DATA_DIR``, no ``LAKEGATE_CONFIG``:
the built-in configuration must find the project's ``data/``. The fixture's
project is a copy of ``conf/`` beside a ``data/`` in a temporary directory
(``LAKEGATE_CONF_DIR`` says where that ``conf/`` is), so the test never
writes the checkout's own ``data/``.
"""

import datetime as dt
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.retained_rule import retained_changes
from bridge.tables.rows import QUARANTINE_SCHEMA
from tests.tables.rows import publish, table

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_the_two_notebooks_exist_and_are_committed_without_outputs():
    assert [p.name for p in NOTEBOOKS] == ["quarantine.ipynb", "retained_state.ipynb"]
    for p in NOTEBOOKS:
        nb = json.loads(p.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell.get("outputs") == [] and cell.get("execution_count") is None, p.name


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project directory: a copy of conf/ and, beside it, data/ with tables."""
    proj = tmp_path_factory.mktemp("nbproject")
    shutil.copytree(ROOT / "conf", proj / "conf")
    d = proj / "data"
    engine = DeltaRsEngine(d / "tables")
    engine.ensure()
    now = dt.datetime.now(dt.timezone.utc)
    seq = 0
    for batch in range(4):
        rows = []
        for dev in range(3):
            seq += 1
            rows.append(publish(f"site/1/dev/{dev}/status", b"" if (batch == 3 and dev == 0) else b"online-%d" % batch,
                                seq=seq, at=now + dt.timedelta(seconds=seq)))
            seq += 1
            rows.append(publish(f"site/1/dev/{dev}/temp", b"21.5", retain=False, seq=seq, at=now + dt.timedelta(seconds=seq)))
        engine.append("messages", table(rows), "fixture", batch)
        engine.merge_retained(retained_changes(table(rows)), "fixture", batch)
    q = [{"stream": "mqtt-frames", "partition": 0, "offset": 100 + i, "seq": 1000 + i, "receive_time": now,
          "receive_date": now.date(), "conn_id": "c9", "client_id": "bad-device", "protocol_level": 5,
          "origin": "client", "packet_type": 3, "rule": rule, "error": f"[{rule}] test", "error_code": 0x81,
          "frame": bytes([0x36, 0x03, 0, 1, 0x61]), "frame_size": 5}
         for i, rule in enumerate(["MQTT-3.3.1-4", "MQTT-3.3.1-4", "MQTT-3.3.2-2"])]
    engine.append("quarantine", pa.Table.from_pylist(q, schema=QUARANTINE_SCHEMA), "fixture", 0)
    return proj


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A kernelspec that runs this interpreter (the venv with lakegate installed)."""
    kdir = tmp_path_factory.mktemp("jupyter") / "kernels" / "python3"
    kdir.mkdir(parents=True)
    (kdir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "lakegate", "language": "python"}))
    return str(kdir.parent.parent)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_headless_in_notebooks_dir_and_reads_the_projects_data(path, project, kernel_env, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_PATH", kernel_env)
    for name in [n for n in os.environ if n.startswith("LAKEGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LAKEGATE_CONF_DIR", str(project / "conf"))
    # a local session here (tests/sqlserve runs a notebook through a run's endpoint): whatever
    # listens on the default port of this machine is not this project's
    monkeypatch.setenv("LAKEGATE_SQL_CONNECT_PORT", "0")
    before = sorted((ROOT / "notebooks").iterdir())
    nb = nbformat.read(path, as_version=4)
    # Jupyter runs a kernel in the notebook's directory.
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "\n".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert f"tables under {project / 'data' / 'tables'} " in text
    assert sorted((ROOT / "notebooks").iterdir()) == before, "the notebook created files beside itself"
    if path.stem == "retained_state":
        assert "topic: site/1/dev/0/status" in text
        images = [o for o in outputs if "image/png" in o.get("data", {})]
        assert images, "the message-rate chart was not drawn"
    else:
        images = [o for o in outputs if "image/png" in o.get("data", {})]
        assert images, "the per-rule chart was not drawn"
        html = "\n".join(o.get("data", {}).get("text/plain", "") for o in outputs)
        assert "MQTT-3.3.1-4" in html and "360300016" in html.replace(" ", "")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_without_tables_stops_in_its_first_cell_saying_where_it_looked(path, kernel_env, tmp_path,
                                                                                monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("JUPYTER_PATH", kernel_env)
    for name in [n for n in os.environ if n.startswith("LAKEGATE_")]:
        monkeypatch.delenv(name)
    shutil.copytree(ROOT / "conf", tmp_path / "conf")  # a project with no data yet
    monkeypatch.setenv("LAKEGATE_CONF_DIR", str(tmp_path / "conf"))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    with pytest.raises(CellExecutionError, match=re.escape(f"no lakegate tables under {tmp_path / 'data' / 'tables'}")):
        client.execute()
    assert not (tmp_path / "data").exists(), "the notebook created empty tables"
