import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.config import Config, ConfigError, load_config, mask_secret
from bridge.config_render import render_toml

ROOT = Path(__file__).resolve().parents[2]


def test_conf_file_is_the_builtin_default():
    from_file = load_config(ROOT / "conf" / "lakegate.toml", env={})
    assert from_file.as_dict() == Config().as_dict()


def test_public_contract_keys_and_defaults():
    cfg = load_config(None, env={})
    assert cfg.data_dir == "../data" and cfg.data_path == ROOT / "data"  # relative to conf/, like the file
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
    assert f'data_dir = "../data"  # default; = {ROOT / "data"}' in out.stdout.splitlines()


# ---------------------------------------------------------------- relative paths (issue 21, item 11)


@pytest.mark.parametrize("cwd", [".", "notebooks", "/"])
def test_default_data_dir_is_the_projects_data_from_any_working_directory(cwd, monkeypatch):
    monkeypatch.delenv("LAKEGATE_CONF_DIR", raising=False)
    monkeypatch.chdir(ROOT / cwd)
    assert load_config(None, env={}).data_path == ROOT / "data"
    assert load_config(ROOT / "conf" / "lakegate.toml", env={}).data_path == ROOT / "data"


def test_relative_paths_in_a_file_are_relative_to_that_file(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    f = site / "lakegate.toml"
    f.write_text('data_dir = "lake"\n[edge]\npassword_file = "users.pw"\ntls_cert_file = "/abs/cert.pem"\n'
                 '[amqp]\ntls_ca_file = "../ca.pem"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(Path("../site/lakegate.toml"), env={})
    assert cfg.data_path == site / "lake"
    assert cfg.capture_dir == site / "lake" / "capture"
    assert cfg.edge.password_file == str(site / "users.pw")
    assert cfg.edge.tls_cert_file == "/abs/cert.pem"
    assert Path(cfg.amqp.tls_ca_file).resolve() == tmp_path / "ca.pem"


def test_relative_paths_from_environment_and_set_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    f = tmp_path / "c.toml"
    f.write_text('data_dir = "from-file"\n')
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert load_config(f, env={"LAKEGATE_DATA_DIR": "env-data"}).data_path == work / "env-data"
    assert load_config(f, ["data_dir=set-data"], env={}).data_path == work / "set-data"
    assert load_config(f, ["edge.password_file=pw"], env={}).edge.password_file == str(work / "pw")


@pytest.mark.parametrize("key", ["data_dir", "edge.password_file", "amqp.tls_ca_file"])
def test_object_storage_url_where_a_local_path_is_needed_is_refused(key, tmp_path):
    with pytest.raises(ConfigError, match=r"s3:// is a URL; object storage is not supported yet"):
        load_config(None, [f"{key}=s3://bucket/lake"], env={})
    f = tmp_path / "c.toml"
    f.write_text('data_dir = "abfss://container@account.dfs.core.windows.net/lake"\n')
    with pytest.raises(ConfigError, match=r"^config error: data_dir: abfss:// is a URL.*\(from .*c\.toml\)$"):
        load_config(f, env={})


@pytest.mark.subprocess
def test_object_storage_data_dir_is_one_line_and_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEGATE_")}
    r = subprocess.run([sys.executable, "-m", "bridge", "status", "--set", "data_dir=s3://bucket/lake"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "lakegate: config error: data_dir: s3:// is a URL; object storage is not supported yet: give a local path "
        "(or a shared file system mounted at the same path everywhere) (from --set data_dir)"]
    assert not (tmp_path / "s3:").exists()


@pytest.mark.parametrize("value, problem", [
    ('-Xss1m "-Dx=y', "cannot be split into options like a shell would"),
    ("Xss1m", "JVM options start with '-'; got 'Xss1m'"),
])
def test_spark_java_options_are_checked(value, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(None, [f"spark.java_options={value}"], env={})


def test_spark_java_options_join_the_log4j_option_and_may_be_emptied():
    from bridge.spark.session import _base_conf

    opts = _base_conf(load_config(None, ["spark.java_options=-Xss2m '-Dlakegate.note=a b'"], env={}))
    assert opts["spark.driver.extraJavaOptions"].startswith("-Xss2m '-Dlakegate.note=a b' -Dlog4j2.configurationFile=")
    empty = _base_conf(load_config(None, ["spark.java_options="], env={}))["spark.driver.extraJavaOptions"]
    assert empty.startswith("-Dlog4j2.configurationFile=") and "Tiered" not in empty
