"""`lakegate demo` from scratch: it starts a background run, publishes the
workload, waits for the job, prints what the README's quick start shows, and
stops the run it started; at the default log level, with nothing of the
libraries' own INFO lines (python-qpid-proton's "Connecting to Url(...)")
between its results."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.ports import free_loopback_port as _free_port
from tests.conftest import child_env

pytestmark = [pytest.mark.spark, pytest.mark.subprocess, pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", ["local", "kafka"])
def test_demo_prints_retained_quarantine_and_forwarding(tmp_path, rabbitmq, backend, request):
    """The same output on either capture log (issue 42: "the same demo output as today")."""
    env = child_env()
    port = _free_port()
    sets = []
    if backend == "kafka":  # a topic of the test's own on the Kafka of scripts/services
        sets = ["capture.backend=kafka", f"kafka.bootstrap_servers={request.getfixturevalue('kafka')}",
                f"kafka.topic={request.getfixturevalue('kafka_topic')('lg-demo')}", "kafka.create_topic=true"]
    out = subprocess.run([sys.executable, "-m", "bridge", "demo", "--set", f"data_dir={tmp_path}",
                          "--set", f"edge.port={port}", "--set", f"amqp.url={rabbitmq}",
                          *[a for kv in sets for a in ("--set", kv)]],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:] + (tmp_path / "demo-run.log").read_text()[-3000:]
    text = out.stdout
    assert not re.search(r" (INFO|DEBUG) (proton|py4j|urllib3|grpc|paho)", text + out.stderr), out.stderr[-3000:]
    assert not re.search(r"^\S+ \S+ (INFO|DEBUG) ", text, re.M), text  # log lines go to stderr, if any
    assert text.startswith("started lakegate run in the background (pid ")
    lines = text.splitlines()
    retained = [ln.split()[0] for ln in lines if ln.startswith("  demo/") and "(cleared" not in ln and "(expired" not in ln]
    assert retained == ["demo/plant-7/dev-01/status", "demo/plant-7/dev-03/status", "demo/plant-7/dev-04/firmware",
                        "demo/plant-7/dev-04/status"] or retained == [
                        "demo/plant-7/dev-01/status", "demo/plant-7/dev-03/status", "demo/plant-7/dev-04/alarm",
                        "demo/plant-7/dev-04/firmware", "demo/plant-7/dev-04/status"]  # alarm: 5 s expiry
    assert "  demo/plant-7/dev-03/status         busy" in text
    assert "demo/plant-7/dev-02/status         (cleared by a zero-byte retained publish)" in text
    assert "MQTT-3.3.1-4   demo-broken-sensor: [MQTT-3.3.1-4] PUBLISH has both QoS bits set" in text
    assert "published: 20 at QoS 0, 27 at QoS 1, 1 at QoS 2 (+1 malformed frame)" in text
    # 48 PUBLISH and 1 PUBREL to forward; the alarm (5 s expiry) is either
    # forwarded or, when its batch came later than that, counted as expired
    job = re.search(r"^job: 48 messages stored, (\d+) forwarded to AMQP(?:, (\d+) not sent "
                    r"\(expired before forwarding\))?$", text, re.M)
    assert job, text
    forwarded, expired = int(job.group(1)), int(job.group(2) or 0)
    assert (forwarded, expired) in ((49, 0), (48, 1))
    assert f"AMQP consumer on /topic/demo.#: {forwarded - 1} AMQP_PUBLISH, 1 AMQP_PUBREL received" in text
    assert expired == 0 or "demo/plant-7/dev-04/alarm" not in retained  # expired then, expired now
    alarm = re.search(r"^alarm demo/plant-7/dev-04/alarm \(expiry 5 s\): (.*)$", text, re.M)
    assert alarm, text
    if expired:
        assert alarm.group(1).startswith("not received over AMQP"), alarm.group(1)
    else:  # forwarded in time: received with what was left of its 5 s
        got = re.fullmatch(r"forwarded, received over AMQP ([\d.]+) s after its PUBACK, ttl ([\d,]+) ms left",
                           alarm.group(1))
        assert got, alarm.group(1)
        assert 0 < int(got.group(2).replace(",", "")) <= 5000
    assert text.rstrip().endswith("stopped the background lakegate run")
    assert not (tmp_path / "run.pid").exists()
