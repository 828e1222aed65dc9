"""``python -m gateway.workers FD``: one data-plane worker, its channel to the main process on
file descriptor FD (started by ``gateway.workers.supervisor``; not a user command)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m gateway.workers FD (started by sluice run)", file=sys.stderr)
        return 2
    from gateway.app import run_worker

    return run_worker(int(argv[0]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
