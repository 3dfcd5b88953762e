"""Child process for the SIGKILL test: appends forever, reports durable records.

Usage: python -m tests.capture.writer_child LOG_DIR
Prints ``ready`` once the log is open, then one line ``i partition offset``
per record *after* its append was reported durable, flushed at once. It
never exits by itself: the parent kills it with SIGKILL.
"""

import sys

from tests.capture.util import conn, frame, headers, key, open_log


def main(path: str) -> None:
    log = open_log(path, fsync_interval_ms=2, fsync_records=64, segment_bytes=64 * 1024)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    pending = []
    i = 0
    while True:
        for _ in range(16):
            pending.append((i, log.append(conn(i), key(i), frame(i), headers(i))))
            i += 1
        done = 0
        lines = []
        for j, ack in pending:
            if not ack.done():
                break
            ack.wait(0)  # raises if the write failed: then nothing is reported
            lines.append(f"{j} {ack.partition} {ack.offset}\n")
            done += 1
        del pending[:done]
        if lines:
            out.write("".join(lines))
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
