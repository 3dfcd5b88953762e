"""The edge's ACL file (bridge/edge/acl.py): Mosquitto 2.0's acl_file format
and decisions, the subscription-coverage check, reload on change, and a
differential test against a private Mosquitto 2.0.11."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from bridge.edge.acl import AclFile, AclFileError, AclWatcher, covers, topic_matches

GOOD = """\
# lakegate ACL test file
topic read public/#
topic write in/anon

user alice
topic readwrite a/#
topic deny a/secret
topic read $SYS/#
topic write with space/a b

user bob
topic r/#

pattern readwrite dev/%c/#
pattern read users/%u/inbox
pattern deny dev/+/locked
"""


@pytest.fixture
def acl() -> AclFile:
    return AclFile.parse(GOOD, "good.acl")


# -- parsing ---------------------------------------------------------------

def test_load_good_file(tmp_path: Path) -> None:
    p = tmp_path / "good.acl"
    p.write_text(GOOD)
    a = AclFile.load(p)
    assert len(a) == 10
    assert "users=2" in repr(a) and "anonymous=True" in repr(a) and "patterns=3" in repr(a)


def test_load_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        AclFile.load(tmp_path / "nope.acl")


@pytest.mark.parametrize("line, message", [
    ("bogus a/b", r"^bad\.acl:3: invalid line: expected 'topic', 'pattern', 'user' or a '#' "
                  r"comment in the first column, got 'bogus'$"),
    ("  # indented comment", r"^bad\.acl:3: invalid line: .* got '#'$"),
    ("\ttopic a", r"^bad\.acl:3: invalid line: .* got '\\ttopic'$"),
    ("topic", r"^bad\.acl:3: 'topic' without a topic$"),
    ("pattern   ", r"^bad\.acl:3: 'pattern' without a topic$"),
    ("topic rw a/b", r"^bad\.acl:3: invalid access 'rw' \(expected read, write, readwrite or "
                     r"deny before the topic\)$"),
    ("topic a b", r"^bad\.acl:3: invalid access 'a' "),
    ("topic read a/#/b", r"^bad\.acl:3: invalid topic filter 'a/#/b' \('\+' and '#' must fill "
                         r"a whole level, '#' only the last; at most 65535 characters and 200 '/'\)$"),
    ("pattern write a+/%c", r"^bad\.acl:3: invalid topic filter 'a\+/%c' "),
    ("topic read " + "a/" * 201 + "b", r"^bad\.acl:3: invalid topic filter "),
    ("user", r"^bad\.acl:3: 'user' without a user name$"),
    ("user    ", r"^bad\.acl:3: 'user' without a user name$"),
])
def test_bad_line_names_file_and_line(line: str, message: str) -> None:
    with pytest.raises(AclFileError, match=message) as err:
        AclFile.parse(f"topic read ok\n# comment\n{line}\ntopic read fine\n", "bad.acl")
    assert "\n" not in str(err.value)


def test_not_utf8_is_an_error() -> None:
    with pytest.raises(AclFileError, match=r"^x\.acl:2: the line is not UTF-8$"):
        AclFile.parse(b"topic a\ntopic read \xff\n", "x.acl")


def test_comments_blank_lines_crlf_and_trailing_blanks() -> None:
    a = AclFile.parse("#c\r\n\r\n   \r\ntopic read  a/b  \r\n#topic write a/b\n", "x")
    assert len(a) == 1
    assert a.can_read(None, "c", "a/b") and not a.can_publish(None, "c", "a/b")


def test_one_word_is_the_topic_with_readwrite() -> None:
    a = AclFile.parse("topic read\ntopic x/y\n")
    assert a.can_publish(None, "c", "read") and a.can_read(None, "c", "read")
    assert a.can_publish(None, "c", "x/y") and a.can_read(None, "c", "x/y")


def test_pattern_without_placeholder_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bridge.edge.acl"):
        a = AclFile.parse("pattern read all/#\n", "w.acl")
    assert a.can_read("anyone", "c", "all/x")
    assert [r.getMessage() for r in caplog.records] == [
        "w.acl:1: ACL pattern without %c or %u (applies to every client alike)"]


# -- sections ----------------------------------------------------------------

def test_anonymous_section_applies_only_without_user_name(acl: AclFile) -> None:
    assert acl.can_read(None, "c1", "public/x/y")
    assert not acl.can_publish(None, "c1", "public/x")
    assert acl.can_publish(None, "c1", "in/anon")
    assert not acl.can_read(None, "c1", "in/anon")
    assert not acl.can_read("alice", "c1", "public/x")   # a user does not get the anonymous rules
    assert not acl.can_publish("carol", "c1", "in/anon")  # nor does an unknown user


def test_user_sections(acl: AclFile) -> None:
    assert acl.can_publish("alice", "c", "a/b/c") and acl.can_read("alice", "c", "a")
    assert not acl.can_publish("bob", "c", "a/b")
    assert acl.can_publish("bob", "c", "r/1") and acl.can_read("bob", "c", "r")
    assert not acl.can_read(None, "c", "r/1")


def test_user_name_and_topic_may_contain_spaces() -> None:
    a = AclFile.parse("user John  Smith \ntopic write  my topic/with spaces  \n")
    assert a.can_publish("John  Smith", "c", "my topic/with spaces")
    assert not a.can_publish("John", "c", "my topic/with spaces")


def test_repeated_user_line_extends_the_section() -> None:
    a = AclFile.parse("user u\ntopic read a\nuser v\ntopic read b\nuser u\ntopic read c\n")
    assert a.can_read("u", "c", "a") and a.can_read("u", "c", "c") and not a.can_read("u", "c", "b")


def test_empty_user_name_is_not_anonymous(acl: AclFile) -> None:
    assert not acl.can_read("", "c", "public/x")


def test_no_acl_entries_refuse_everything() -> None:
    a = AclFile.parse("# nothing granted\n")
    assert not a.can_publish(None, "c", "a") and not a.can_read("u", "c", "a")
    assert not a.can_subscribe(None, "c", "a")


# -- access words, deny --------------------------------------------------------

def test_read_write_readwrite() -> None:
    a = AclFile.parse("topic read r\ntopic write w\ntopic readwrite rw\n")
    assert (a.can_read(None, "c", "r"), a.can_publish(None, "c", "r")) == (True, False)
    assert (a.can_read(None, "c", "w"), a.can_publish(None, "c", "w")) == (False, True)
    assert (a.can_read(None, "c", "rw"), a.can_publish(None, "c", "rw")) == (True, True)


def test_deny_wins_over_earlier_grant_in_the_same_section(acl: AclFile) -> None:
    assert acl.can_publish("alice", "c", "a/public")
    assert not acl.can_publish("alice", "c", "a/secret")
    assert not acl.can_read("alice", "c", "a/secret")


def test_deny_pattern_wins_over_grant_pattern(acl: AclFile) -> None:
    assert acl.can_publish("alice", "d1", "dev/d1/x")
    assert not acl.can_publish(None, "d1", "dev/d1/locked")


def test_user_grant_is_found_before_a_deny_pattern() -> None:
    a = AclFile.parse("user u\ntopic write x/#\npattern deny x/%u\n")
    assert a.can_publish("u", "c", "x/u")  # Mosquitto: the user's list answers first
    a2 = AclFile.parse("user u\ntopic deny x/u\npattern write x/%u\n")
    assert not a2.can_publish("u", "c", "x/u")


# -- patterns ----------------------------------------------------------------

def test_pattern_client_id(acl: AclFile) -> None:
    assert acl.can_publish(None, "d1", "dev/d1/temp") and acl.can_read("bob", "d1", "dev/d1")
    assert not acl.can_publish(None, "d1", "dev/d2/temp")


def test_pattern_username(acl: AclFile) -> None:
    assert acl.can_read("bob", "x", "users/bob/inbox")
    assert not acl.can_read("bob", "x", "users/alice/inbox")
    assert not acl.can_publish("bob", "x", "users/bob/inbox")
    assert not acl.can_read(None, "x", "users/%u/inbox")  # %u never applies without a user name


@pytest.mark.parametrize("username, client_id", [
    (None, "d+1"), (None, "d#"), ("b+", "d1"), ("#", "d1")])
def test_plus_or_hash_in_id_or_name_refuses_patterns(acl: AclFile, username, client_id) -> None:
    assert not acl.can_publish(username, client_id, f"dev/{client_id}/x")
    assert not acl.can_read(username, client_id, "dev/d1/x")


def test_dangerous_name_still_gets_its_user_section() -> None:
    a = AclFile.parse("user a+b\ntopic write t\npattern write p/%c\n")
    assert a.can_publish("a+b", "c", "t") and not a.can_publish("a+b", "c", "p/c")


def test_slash_in_client_id_spans_levels_as_in_mosquitto_2(acl: AclFile) -> None:
    assert acl.can_publish(None, "x/y", "dev/x/y/t")


def test_percent_escapes_scan_left_to_right() -> None:
    a = AclFile.parse("pattern write a/%%c/%cu\n")
    assert a.can_publish(None, "id", "a/%id/idu")


# -- $ topics -----------------------------------------------------------------

def test_dollar_topics(acl: AclFile) -> None:
    assert acl.can_read("alice", "c", "$SYS/broker/uptime")
    assert not acl.can_read("bob", "c", "$SYS/broker/uptime")
    a = AclFile.parse("topic #\ntopic $SYS/#\n")
    assert not a.can_publish(None, "c", "$SYS/x")  # $SYS is never written ...
    assert a.can_publish(None, "c", "$SYS/broker/connection/b1/state")  # ... but bridge state
    assert not a.can_publish(None, "c", "$share/g/t") and not a.can_read(None, "c", "$share/g/t")
    assert not AclFile.parse("topic #\n").can_read(None, "c", "$other/x")  # '#' skips $ topics


def test_topic_matches() -> None:
    assert topic_matches("a/#", "a") and topic_matches("a/+/#", "a/b") and topic_matches("#", "a/b")
    assert topic_matches("a/+", "a/") and not topic_matches("a/+", "a")
    assert not topic_matches("+/x", "$SYS/x") and topic_matches("$SYS/+", "$SYS/x")
    assert not topic_matches("a/#", "a/+") and not topic_matches("a/b#", "a/b#")


# -- subscribe coverage --------------------------------------------------------

@pytest.mark.parametrize("acl_filter, sub, covered", [
    ("a/#", "a/#", True), ("a/#", "a", True), ("a/#", "a/+/c", True), ("a/#", "a/b/#", True),
    ("a/+", "a/b", True), ("a/+", "a/+", True), ("a/+", "a/#", False), ("a/+", "a", False),
    ("a/b", "a/+", False), ("a/b", "a/b", True), ("#", "a/#", True), ("#", "#", True),
    ("a/+/c", "a/+/c", True), ("a/+/c", "a/+/#", False), ("+/+", "+/b", True),
    ("#", "$SYS/#", False), ("$SYS/#", "$SYS/broker/+", True), ("$SYS/#", "x", False),
])
def test_covers(acl_filter: str, sub: str, covered: bool) -> None:
    assert covers(acl_filter, sub) is covered


def test_can_subscribe(acl: AclFile) -> None:
    assert acl.can_subscribe(None, "c", "public/#") and acl.can_subscribe(None, "c", "public/+/x")
    assert not acl.can_subscribe(None, "c", "#")          # not covered by public/#
    assert not acl.can_subscribe(None, "c", "in/anon")    # write only
    assert acl.can_subscribe("alice", "c", "a/#")         # a deny inside is applied at delivery
    assert not acl.can_subscribe("alice", "c", "a/secret")  # a deny covering it refuses
    assert acl.can_subscribe("alice", "c", "$SYS/broker/#")
    assert acl.can_subscribe("bob", "d7", "dev/d7/#") and not acl.can_subscribe("bob", "d7", "dev/+/x")
    assert not acl.can_subscribe("bob", "d+", "dev/d+/#")
    assert acl.can_subscribe(None, "c", "$share/g/public/#")
    assert not acl.can_subscribe(None, "c", "$share/g/#") and not acl.can_subscribe(None, "c", "$share/g")


# -- reload ------------------------------------------------------------------

def _rewrite(p: Path, text: str, bump: float) -> None:
    p.write_text(text)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + int(bump * 1e9)))


def test_watcher_reloads_on_change(tmp_path: Path) -> None:
    p = tmp_path / "w.acl"
    p.write_text("topic read a\n")
    w = AclWatcher(p, interval_s=2.0, now=100.0)
    assert w.current(100.0).can_read(None, "c", "a")
    _rewrite(p, "topic read b\n", 5)
    assert w.current(101.0).can_read(None, "c", "a")  # not looked at before interval_s
    acl = w.current(102.0)
    assert acl.can_read(None, "c", "b") and not acl.can_read(None, "c", "a")
    assert w.reloads == 1
    assert w.current(104.0) is acl  # unchanged file: same object, no reread


def test_watcher_same_size_same_mtime_new_inode(tmp_path: Path) -> None:
    p = tmp_path / "w.acl"
    p.write_text("topic read a\n")
    w = AclWatcher(p, interval_s=1.0, now=0.0)
    st = p.stat()
    q = tmp_path / "new.acl"
    q.write_text("topic read b\n")
    os.utime(q, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(q, p)
    assert w.check(5.0) and w.current(5.0).can_read(None, "c", "b")


def test_watcher_bad_reload_keeps_old_rules(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "w.acl"
    p.write_text("topic read a\n")
    w = AclWatcher(p, interval_s=2.0, now=0.0)
    _rewrite(p, "topic read a\nfrobnicate\n", 5)
    with caplog.at_level(logging.WARNING, logger="bridge.edge.acl"):
        assert w.current(2.0).can_read(None, "c", "a")
        assert w.current(4.0).can_read(None, "c", "a")  # logged once, not at every check
    assert [r.getMessage() for r in caplog.records] == [
        f"ACL file reload failed, keeping the previous rules: {p}:2: invalid line: expected "
        f"'topic', 'pattern', 'user' or a '#' comment in the first column, got 'frobnicate'"]
    assert w.failures == 1
    _rewrite(p, "topic read c\n", 10)
    assert w.current(6.0).can_read(None, "c", "c")


def test_watcher_file_removed_keeps_old_rules(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "w.acl"
    p.write_text("topic read a\n")
    w = AclWatcher(p, interval_s=1.0, now=0.0)
    p.unlink()
    with caplog.at_level(logging.WARNING, logger="bridge.edge.acl"):
        assert w.current(1.0).can_read(None, "c", "a") and w.current(2.0).can_read(None, "c", "a")
    assert len(caplog.records) == 1 and "keeping the previous rules" in caplog.records[0].getMessage()


def test_watcher_missing_or_bad_file_at_start(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        AclWatcher(tmp_path / "none.acl")
    (tmp_path / "bad.acl").write_text("topic rw x\n")
    with pytest.raises(AclFileError, match=r"bad\.acl:1: invalid access 'rw'"):
        AclWatcher(tmp_path / "bad.acl")


# -- config ------------------------------------------------------------------

def test_config_acl_file_relative_to_config_file(tmp_path: Path) -> None:
    from bridge.config import load_config
    site = tmp_path / "site"
    site.mkdir()
    f = site / "lakegate.toml"
    f.write_text('[edge]\nacl_file = "rules.acl"\n')
    assert load_config(f, [], env={}).edge.acl_file == str(site / "rules.acl")
    assert load_config(None, [], env={}).edge.acl_file == ""
