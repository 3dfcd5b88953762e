"""Which of two states of a retained topic wins: the job's rule, used by
both MERGEs (``bridge/tables/deltars.py``, ``deltaspark.py``) and by the
edge's overlay (``bridge/edge/retained/overlay.py``); re-exported by
``bridge/tables/retained_rule.py``, where the rest of the retained rule is.
No imports: the edge loads it without Arrow's compute module."""

__all__ = ["SUPERSEDES_SQL", "supersedes"]

#: The MERGE's update condition (source ``s``, table ``t``), the SQL form of
#: :func:`supersedes`.
SUPERSEDES_SQL = "s.seq > t.seq"


def supersedes(new_seq: int, old_seq: int) -> bool:
    """Whether a retained change with capture sequence ``new_seq`` replaces
    the topic's state of sequence ``old_seq``: the later capture wins, so a
    late, older record never overwrites a newer one (:data:`SUPERSEDES_SQL`)."""
    return new_seq > old_seq
