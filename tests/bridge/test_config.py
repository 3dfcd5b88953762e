import subprocess
import sys
from pathlib import Path

import pytest

from bridge.config import Config, ConfigError, load_config, mask_secret, render_toml

ROOT = Path(__file__).resolve().parents[2]


def test_conf_file_is_the_builtin_default():
    from_file = load_config(ROOT / "conf" / "lakegate.toml", env={})
    assert from_file.as_dict() == Config().as_dict()


def test_public_contract_keys_and_defaults():
    cfg = load_config(None, env={})
    assert cfg.data_dir == "./data"
    assert (cfg.edge.host, cfg.edge.port) == ("127.0.0.1", 1883)
    assert cfg.amqp.url == "amqp://guest:guest@127.0.0.1:5672"
    assert cfg.amqp.profile == "seed"
    assert "{routing_key}" in cfg.amqp.address_template


def test_precedence_file_lt_env_lt_set(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('data_dir = "/from/file"\n[edge]\nport = 1000\nhost = "10.0.0.1"\n[amqp]\nprofile = "enmasse"\n')
    env = {"LAKEGATE_EDGE_PORT": "2000", "LAKEGATE_DATA_DIR": "/from/env", "LAKEGATE_AMQP_URL": ""}
    cfg = load_config(f, ["edge.port=3000"], env=env)
    assert cfg.edge.port == 3000 and cfg.sources["edge.port"] == "--set edge.port"
    assert cfg.data_dir == "/from/env" and cfg.sources["data_dir"] == "environment LAKEGATE_DATA_DIR"
    assert cfg.edge.host == "10.0.0.1" and cfg.sources["edge.host"] == str(f)
    assert cfg.amqp.profile == "enmasse"
    assert cfg.amqp.url == ""  # empty = forwarding off
    assert "edge.tls_port" not in cfg.sources  # default


def test_unknown_key_in_file_names_key_and_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[edge]\nprot = 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(f, env={})
    assert err.value.key == "edge.prot"
    assert str(err.value).startswith("config error: edge.prot: unknown key; known keys in [edge]: ")
    assert str(err.value).endswith(f"(from {f})")


def test_unknown_section_in_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[edgy]\nport = 1\n")
    with pytest.raises(ConfigError, match=r"^config error: edgy: unknown section \(from .*bad\.toml\)$"):
        load_config(f, env={})


def test_wrong_type_in_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('[edge]\nport = "1883"\n')
    with pytest.raises(ConfigError, match=r"^config error: edge\.port: expected an integer, got str '1883' \(from .*\)$"):
        load_config(f, env={})


def test_bool_is_not_an_integer(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[edge]\nport = true\n")
    with pytest.raises(ConfigError, match="expected an integer"):
        load_config(f, env={})


def test_wrong_type_from_env_names_the_variable():
    with pytest.raises(ConfigError, match=r"^config error: edge\.port: expected an integer, got 'abc' \(from environment LAKEGATE_EDGE_PORT\)$"):
        load_config(None, env={"LAKEGATE_EDGE_PORT": "abc"})


def test_unknown_key_from_env_in_known_section():
    with pytest.raises(ConfigError, match=r"^config error: edge\.portt: unknown key.*\(from environment LAKEGATE_EDGE_PORTT\)$"):
        load_config(None, env={"LAKEGATE_EDGE_PORTT": "1"})


def test_unrelated_lakegate_env_vars_are_ignored():
    cfg = load_config(None, env={"LAKEGATE_SERVICES_DIR": "/x", "LAKEGATE_CONF_DIR": "/y"})
    assert cfg.as_dict() == Config().as_dict()


def test_set_requires_key_value():
    with pytest.raises(ConfigError, match=r"^config error: edge\.port: expected KEY=VALUE \(from --set\)$"):
        load_config(None, ["edge.port"], env={})


def test_choices_and_ranges_are_checked():
    with pytest.raises(ConfigError, match=r"amqp\.profile: must be one of seed, enmasse, got 'x'"):
        load_config(None, ["amqp.profile=x"], env={})
    with pytest.raises(ConfigError, match=r"edge\.port: must be a TCP port"):
        load_config(None, ["edge.port=70000"], env={})
    with pytest.raises(ConfigError, match=r"amqp\.url: must be amqp://"):
        load_config(None, ["amqp.url=http://x"], env={})


def test_bool_text_forms():
    assert load_config(None, ["edge.allow_anonymous=no"], env={}).edge.allow_anonymous is False
    assert load_config(None, ["edge.allow_anonymous=ON"], env={}).edge.allow_anonymous is True
    with pytest.raises(ConfigError, match="expected true or false, got 'maybe'"):
        load_config(None, ["edge.allow_anonymous=maybe"], env={})


def test_secrets_are_masked_in_show():
    cfg = load_config(None, ["amqp.url=amqp://u:s3cret@h:5672", "amqp.password=hunter2"], env={})
    text = render_toml(cfg)
    assert "s3cret" not in text and "hunter2" not in text
    assert 'url = "amqp://u:****@h:5672"' in text
    assert mask_secret("amqp.url", "amqp://h:5672") == "amqp://h:5672"
    assert "s3cret" not in cfg.to_json()


def _cli(*args, env=None):
    import os

    e = {k: v for k, v in os.environ.items() if not k.startswith("LAKEGATE_")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, env=e, cwd=ROOT)


@pytest.mark.subprocess
def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[amqp]\nprofil = 'seed'\n")
    out = _cli("config", "show", "--config", str(f))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "amqp.profil" in lines[0] and str(f) in lines[0]


@pytest.mark.subprocess
def test_cli_config_show_reports_sources():
    out = _cli("config", "show", "--set", "edge.port=1999", env={"LAKEGATE_AMQP_PROFILE": "enmasse"})
    assert out.returncode == 0, out.stderr
    assert "port = 1999  # --set edge.port" in out.stdout
    assert 'profile = "enmasse"  # environment LAKEGATE_AMQP_PROFILE' in out.stdout
    assert "guest:****@" in out.stdout
