"""A latency histogram as plain data, for hot paths that must not depend on
prometheus_client (the edge's event loop, the capture log's commit thread):
``observe`` is a bisect and two additions; the collector turns it into a
Prometheus histogram at scrape time."""

from __future__ import annotations

from bisect import bisect_left

__all__ = ["ACK_BUCKETS_S", "Buckets", "FSYNC_BUCKETS_S"]

#: QoS 1/2 acknowledgement: a group commit here is 1-10 ms
ACK_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: one commit's fdatasync calls
FSYNC_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Buckets:
    """Counts per upper bound (cumulative only when read), the sum and the count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, cumulative count)] with "+Inf" last, as Prometheus wants them."""
        out, total = [], 0
        for bound, n in zip(self.bounds, self.counts):
            total += n
            out.append((repr(float(bound)), total))
        out.append(("+Inf", total + self.counts[-1]))
        return out
