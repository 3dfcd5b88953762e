"""The real services the suite depends on: RabbitMQ (AMQP 1.0) and Mosquitto."""

import os
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]


def test_amqp10_message_round_trip_through_rabbitmq(rabbitmq):
    from proton import Message
    from proton.utils import BlockingConnection

    name = "lg-test-" + uuid.uuid4().hex[:8]
    conn = BlockingConnection(rabbitmq, allowed_mechs="PLAIN")
    try:
        receiver = conn.create_receiver(f"/queue/{name}")
        sender = conn.create_sender(f"/queue/{name}")
        sender.send(Message(body=b"\x00hello", id=7, durable=True, annotations={"x-qos": 1}))
        got = receiver.receive(timeout=10)
        receiver.accept()
        assert bytes(got.body) == b"\x00hello"
        assert got.id == 7 and got.durable is True
        assert got.annotations["x-qos"] == 1
    finally:
        conn.close()
        subprocess.run(["rabbitmqctl", "-q", "delete_queue", name], capture_output=True)


def test_mqtt_message_round_trip_through_mosquitto(mosquitto):
    import paho.mqtt.client as mqtt

    host, port = mosquitto
    topic = "lakegate/test/" + uuid.uuid4().hex[:8]
    got: list[bytes] = []
    subscribed, received = threading.Event(), threading.Event()

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    sub.on_subscribe = lambda *a: subscribed.set()

    def on_message(client, userdata, msg):
        got.append(msg.payload)
        received.set()

    sub.on_message = on_message
    sub.connect(host, port)
    sub.loop_start()
    try:
        sub.subscribe(topic, qos=1)
        assert subscribed.wait(10)
        pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        pub.connect(host, port)
        pub.loop_start()
        pub.publish(topic, b"hello", qos=1).wait_for_publish(10)
        pub.loop_stop()
        pub.disconnect()
        assert received.wait(10)
        assert got == [b"hello"]
    finally:
        sub.loop_stop()
        sub.disconnect()


def test_services_script_without_apt_is_a_clear_message():
    env = dict(os.environ, RABBITMQ_SERVER_BIN="/nonexistent/rabbitmq-server", APT_GET_BIN="/nonexistent/apt-get")
    out = subprocess.run([str(ROOT / "scripts" / "services"), "up"], capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "services: missing rabbitmq-server and this machine has no apt-get; install RabbitMQ "
        "(with the rabbitmq_amqp1_0 plugin) and Mosquitto with your package manager, then run 'scripts/services up' again"
    )
    assert "Traceback" not in out.stderr


def test_services_status_reports_both(rabbitmq, mosquitto):
    out = subprocess.run([str(ROOT / "scripts" / "services"), "status"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rabbitmq: up on 127.0.0.1:5672" in out.stdout and "amqp1_0 plugin on" in out.stdout
    assert "mosquitto: up on 127.0.0.1:18830" in out.stdout


def test_services_rabbitmq_mqtt_plugin_on_loopback_and_the_leftover_policy(rabbitmq):
    """What `scripts/services up` sets on RabbitMQ beyond AMQP 1.0: its MQTT
    plugin on 127.0.0.1:18831 only (lakegate bench downlink compares with
    it; never 1883, the edge's port), and the policy that expires the queues
    RabbitMQ 3.x leaves behind /topic/ receivers (rabbitmq-server#2588)."""
    ctl = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    listeners = subprocess.run([ctl, "-q", "eval", "rabbit_networking:active_listeners()."],
                               capture_output=True, text=True, timeout=60).stdout
    mqtt = [ln for ln in listeners.replace("\n", " ").split("{listener,") if "mqtt" in ln]
    assert mqtt and all("{127,0,0,1}" in ln and "18831" in ln for ln in mqtt), listeners
    policies = subprocess.run([ctl, "-q", "list_policies"], capture_output=True, text=True,
                              timeout=60).stdout
    assert "lakegate-amqp1-leftovers" in policies and '"expires":60000' in policies, policies


def _fake_apt(tmp_path: Path, policy: Path, fail: bool) -> Path:
    """An apt-get that records, during ``install``, whether a policy-rc.d
    forbids starting services (what invoke-rc.d asks it), then succeeds or fails."""
    apt = tmp_path / "apt-get"
    apt.write_text(f"""#!/bin/sh
case "$*" in
  *install*) if [ -x '{policy}' ]; then '{policy}' mosquitto start; echo "policy $?" >> '{tmp_path}/apt.log'
             else echo "no policy" >> '{tmp_path}/apt.log'; fi
             exit {1 if fail else 0} ;;
esac
exit 0
""")
    apt.chmod(0o755)
    return apt


@pytest.mark.parametrize("fail", [False, True], ids=["install-ok", "install-fails"])
def test_services_install_forbids_the_packages_starting_their_own_instances(tmp_path, fail, rabbitmq, mosquitto):
    # Both services already answer, so after the (fake) install the script
    # leaves them alone; only the install step is exercised.
    policy = tmp_path / "policy-rc.d"
    env = dict(os.environ, RABBITMQ_SERVER_BIN="/nonexistent/rabbitmq-server", POLICY_RC_D=str(policy),
               APT_GET_BIN=str(_fake_apt(tmp_path, policy, fail)), LAKEGATE_SERVICES_DIR=str(tmp_path / "state"))
    out = subprocess.run([str(ROOT / "scripts" / "services"), "up"], capture_output=True, text=True, env=env)
    assert (tmp_path / "apt.log").read_text() == "policy 101\n"  # 101: action forbidden
    assert not policy.exists(), "policy-rc.d left behind"
    assert out.returncode == (1 if fail else 0), out.stderr
