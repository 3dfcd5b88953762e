"""Child process for the tap SIGKILL test: a tap whose capture log never gets
a record to disk.

Usage: python -m tests.tap.tap_child DATA_DIR BROKER_URL CLIENT_ID FILTER

Every write of the capture log's flusher blocks forever, so nothing the tap
appends becomes durable and nothing may be acknowledged to the broker. Prints
``ready`` once subscribed, then ``appended`` once per record appended (never
anything of the message), flushed at once. Never exits by itself: the parent
kills it with SIGKILL.
"""

import sys
import threading

from bridge.capture import CaptureLog
from bridge.capture import partition as partition_mod
from bridge.config import load_config
from bridge.tap import Tap


class _PrintingLog:
    """The capture log, reporting each append on stdout."""

    def __init__(self, log: CaptureLog) -> None:
        self._log = log

    def append(self, *args, **kwargs):
        ack = self._log.append(*args, **kwargs)
        sys.stdout.write("appended\n")
        sys.stdout.flush()
        return ack

    def __getattr__(self, name):
        return getattr(self._log, name)


def _never(fd, data):
    threading.Event().wait()


def main(data_dir: str, broker: str, client_id: str, topic: str) -> None:
    cfg = load_config(None, [f"data_dir={data_dir}", f"tap.broker={broker}", f"tap.client_id={client_id}",
                             "capture.partitions=1"], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    partition_mod.write_all = _never  # the disk never takes a record
    tap = Tap(cfg, topics=[topic], capture_log=_PrintingLog(log))
    t = threading.Thread(target=tap.run, daemon=True)
    t.start()
    if not tap.wait_subscribed(20):
        sys.exit("tap_child: not subscribed")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    t.join()


if __name__ == "__main__":
    main(*sys.argv[1:5])
