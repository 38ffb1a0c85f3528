#!/usr/bin/env python3
"""Run one command under limits and measure it; print one JSON line (the run-time corpus's wrapper).

Usage::

    python tests/runtime/measure.py --timeout S --memory BYTES --stdout FILE --stderr FILE [--pipe] [--cwd DIR] -- ARGV...

The command runs in its own session (its process group is killed at the timeout and once it has
exited, so nothing it started outlives it) with RLIMIT_AS = ``--memory`` and no core dumps.
``--pipe`` gives its stderr a pipe instead of a file (a log read by another program).

Why a wrapper: a child's peak RSS (``ru_maxrss``) starts at its parent's at the moment of the
fork, and pytest's process holds torch and every in-process case. This small process forks the
command and reads ``getrusage(RUSAGE_CHILDREN)`` after waiting for it: the largest RSS of the
command and of every process it waited for (torchrun's workers included).

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--memory", type=int, required=True)
    parser.add_argument("--stdout", required=True)
    parser.add_argument("--stderr", required=True)
    parser.add_argument("--pipe", action="store_true")
    parser.add_argument("--cwd", default=None)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv and args.argv[0] == "--" else args.argv

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (args.memory, args.memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    start = time.monotonic()
    with open(args.stdout, "wb") as out, open(args.stderr, "wb") as err:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.PIPE if args.pipe else err,
            cwd=args.cwd,
            preexec_fn=limits,
            start_new_session=True,
        )
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        timer = threading.Timer(args.timeout, expire)
        timer.start()
        if args.pipe:
            for chunk in iter(lambda: process.stderr.read(65536), b""):
                err.write(chunk)
        status = process.wait()
        wall = time.monotonic() - start
        timer.cancel()
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever it left running in its group
        except (ProcessLookupError, PermissionError):
            pass
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "status": status,
                "timed_out": expired.is_set(),
                "wall_s": wall,
                "peak_mb": usage.ru_maxrss / 1024.0,
                "cpu_s": usage.ru_utime + usage.ru_stime,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
