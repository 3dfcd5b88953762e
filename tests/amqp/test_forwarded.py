"""The forward-acknowledgement channel the edge reads: ForwardedOffsets."""

from __future__ import annotations

import asyncio
import threading

from bridge.amqp.forwarded import NOTHING, ForwardedOffsets


def test_nothing_forwarded_yet(tmp_path):
    assert ForwardedOffsets(tmp_path).get(0) == NOTHING == -1


def test_record_only_raises_the_mark_and_is_per_stream_and_partition(tmp_path):
    fo = ForwardedOffsets(tmp_path, "s")
    assert fo.record(1, 10) == 10
    assert fo.record(1, 7) == 10  # never lowered (a re-run batch)
    assert fo.get(1) == 10 and fo.get(0) == NOTHING
    assert ForwardedOffsets(tmp_path, "other").get(1) == NOTHING
    assert (tmp_path / "forwarded" / "s-1").read_text() == "10\n"
    assert sorted(p.name for p in (tmp_path / "forwarded").iterdir() if not p.name.startswith(".")) == ["s-1"]


def test_wait_for_returns_when_the_mark_passes_the_offset(tmp_path):
    fo = ForwardedOffsets(tmp_path)
    fo.record(0, 4)
    assert fo.wait_for(0, 4, timeout=0)
    assert not fo.wait_for(0, 5, timeout=0.05)
    waiting = threading.Event()
    result: list[bool] = []

    def waiter() -> None:
        waiting.set()
        result.append(fo.wait_for(0, 9, timeout=10))

    t = threading.Thread(target=waiter)
    t.start()
    waiting.wait(5)
    ForwardedOffsets(tmp_path).record(0, 12)
    t.join(10)
    assert result == [True]


def test_wait_for_async(tmp_path):
    fo = ForwardedOffsets(tmp_path)

    async def main() -> list[bool]:
        task = asyncio.create_task(fo.wait_for_async(3, 2, timeout=10))
        await asyncio.sleep(0)
        fo.record(3, 2)
        return [await task, await fo.wait_for_async(3, 3, timeout=0.05)]

    assert asyncio.run(main()) == [True, False]


def test_the_mark_moves_only_once_the_peer_accepted(tmp_path):
    # what edge.ack_after = "forward" waits on: nothing until the dispositions came
    import concurrent.futures

    from bridge.amqp.sink import forward_rows
    from bridge.config import load_config
    from tests.amqp.peer import FakePeer
    from tests.amqp.rows import row

    with FakePeer(policy=lambda p, a, m, n: "hold") as peer:
        amqp = load_config(None, [f"amqp.url={peer.url}"], env={}).amqp
        rows = [row("a", off, qos=1, packet_id=off, partition=2) for off in (10, 11, 15)]
        fo = ForwardedOffsets(tmp_path)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(forward_rows, iter(rows), amqp, str(tmp_path))
            assert peer.wait(lambda p: len(p.messages) == 3)
            assert fo.get(2) == NOTHING and not fut.done()
            peer.release_held()
            assert fut.result(timeout=10).accepted == 3
        assert fo.get(2) == 15 and fo.wait_for(2, 15, timeout=0)
