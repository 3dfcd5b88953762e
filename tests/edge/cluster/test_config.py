"""Cluster settings that do not fit together are one line naming the key,
with LG-cluster-config (issue 43, bad input), before anything starts."""

from __future__ import annotations

import pytest

from bridge.cli import main
from bridge.config import ConfigError, load_config


@pytest.mark.parametrize("sets, key, words", [
    (["cluster.edges=2"], "cluster.edges", 'capture.backend = "kafka"'),
    (["cluster.edges=3", "capture.backend=kafka", "capture.partitions=2"], "cluster.edges",
     "capture.partitions is 2"),
    (["cluster.edges=2", "cluster.edge_id=2", "capture.backend=kafka"], "cluster.edge_id", "must be 0-1"),
    (["cluster.edges=0"], "cluster.edges", "must be positive"),
    (["cluster.edge_id=300"], "cluster.edge_id", "must be 0-255"),
    (["cluster.lease_s=0"], "cluster.lease_s", "must be positive"),
])
def test_lg_cluster_config_refuses_settings_that_do_not_fit(sets, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(None, sets, env={})
    assert err.value.key == key and words in str(err.value)


def test_lg_cluster_config_lakegate_run_refuses_a_cluster(capsys, tmp_path):
    rc = main(["run", "--set", f"data_dir={tmp_path}", "--set", "capture.backend=kafka",
               "--set", "cluster.edges=2"])
    err = capsys.readouterr().err
    assert rc == 2 and "lakegate process once" in err and "[LG-cluster-config]" in err
    assert len(err.strip().splitlines()) == 1
