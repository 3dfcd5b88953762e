"""``--as-of`` resolution, shared by both engines (``Engine.resolve_as_of``
over the table's commit history): a version or an ISO timestamp becomes the
version to read and the moment ``retained`` judges expiry by.

Run on both engines over a fixed history (the engine's ``commits``
replaced), so that every case -- zones, no zone, after the newest, before
the first -- is exact. How each engine then reads the version, and that
both date a version alike, is tested with real tables in test_engines.py.
"""

import datetime as dt

import pytest

from bridge.tables.engine import AsOfError, Commit
from tests.tables.rows import ENGINES, open_engine

UTC = dt.timezone.utc
T = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
HISTORY = [Commit(3, T), Commit(4, T + dt.timedelta(minutes=1)), Commit(5, T + dt.timedelta(minutes=2))]


@pytest.fixture(params=ENGINES)
def engine(request, tmp_path, monkeypatch):
    e = open_engine(request.param, tmp_path / "tables", request)
    monkeypatch.setattr(e, "commits", lambda table: list(HISTORY))
    return e


def test_versions_come_from_the_history(engine):
    rng = engine.versions("retained")
    assert (rng.oldest, rng.newest) == (3, 5)


@pytest.mark.parametrize("as_of, version, moment", [
    ("2026-11-22T12:00:00Z", 3, T),
    ("2026-11-22T12:01:30+00:00", 4, T + dt.timedelta(minutes=1, seconds=30)),
    ("2026-11-22 13:01:00+01:00", 4, T + dt.timedelta(minutes=1)),   # another zone
    ("2026-11-22T12:02:00", 5, T + dt.timedelta(minutes=2)),         # no zone: UTC
    ("2026-11-23T00:00:00Z", 5, T + dt.timedelta(hours=12)),         # after the newest: the newest
    (4, 4, T + dt.timedelta(minutes=1)),                             # a version: its commit time
])
def test_as_of_resolves_to_the_newest_version_committed_at_or_before_it(engine, as_of, version, moment):
    got = engine.resolve_as_of("retained", as_of)
    assert (got.version, got.moment) == (version, moment)


def test_time_before_the_first_commit_is_one_line(engine):
    with pytest.raises(AsOfError) as err:
        engine.resolve_as_of("retained", "2026-11-22T11:59:59Z")
    assert str(err.value) == ("retained: no version at or before 2026-11-22T11:59:59.000Z (oldest 3 committed "
                              "2026-11-22T12:00:00.000Z, newest 5 committed 2026-11-22T12:02:00.000Z)")


def test_missing_version_and_bad_text_are_one_line(engine):
    with pytest.raises(AsOfError, match=r"^retained: version 2 does not exist \(oldest 3, newest 5\)$"):
        engine.resolve_as_of("retained", 2)
    with pytest.raises(AsOfError, match=r"^--as-of 'last week' is neither a version number nor an ISO timestamp$"):
        engine.resolve_as_of("retained", "last week")
