import pytest

from bridge.topic_filter import matches, valid_filter

CASES = [
    # filter, topic, expected
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("a/b", "a/b", True),
    ("a/b", "a/B", False),
    ("a/b", "a/b/", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("#", "$SYS/x", False),
    ("$SYS/#", "$SYS/x", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("a/+/c", "a//c", True),
]


@pytest.mark.parametrize("flt,topic,expected", CASES)
def test_mqtt_4_7_matching(flt, topic, expected):
    assert matches(flt, topic) is expected


def test_mqtt_4_7_2_1_wildcard_first_never_matches_dollar_topics():
    assert matches("+/x", "$a/x") is False
    assert matches("#", "$SYS") is False


@pytest.mark.parametrize("bad", ["", "a/#/b", "a#", "a/b+", "+a", "#/", "a\x00b"])
def test_mqtt_4_7_1_ill_formed_filters_give_null(bad):
    assert valid_filter(bad) is False
    assert matches(bad, "a/b") is None


def test_null_inputs_and_invalid_topics():
    assert matches(None, "a") is None and matches("a", None) is None
    assert matches("#", "") is False
    assert matches("#", "a/+") is False
