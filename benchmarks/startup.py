"""How long the embedded server takes to become ready: starts that calibrate their engines (the
calibration cache emptied first) against starts that reuse the calibration the previous start left,
taking turns.

    .venv/bin/python benchmarks/startup.py [--rounds 3]

Starts the embedded profile's server on free ports, 2 x --rounds times, and stops it each time once
it is ready. Prints, and writes to --out (benchmarks/results/startup/startup.md, with the machine it
ran on), each start's seconds from launch to ready, by kind, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

from performance import publish

from specdec.build import build
from specdec.client.machine import describe, summary_line
from specdec.config import load_profile
from specdec.speculation.controller import calibration_cache_dir
from specdec.triton.serve import Ports, TritonServer

RESULT = Path(__file__).parent / "results" / "startup" / "startup.md"
KINDS = ("calibrating", "reusing")


def time_to_ready(profile) -> float:
    """Seconds from launching the server to its answering ready; then it is stopped."""
    start = time.perf_counter()
    with TritonServer(profile, ports=Ports.free()):
        return time.perf_counter() - start


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--rounds", type=int, default=3, help="starts of each kind")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    profile = load_profile()
    build(profile)
    machine = describe()  # its load averages as the starts begin
    cache = calibration_cache_dir(profile.build_path())
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for r in range(args.rounds):
        shutil.rmtree(cache, ignore_errors=True)  # the first start of a round calibrates, the second reuses
        for kind in KINDS:
            seconds[kind].append(time_to_ready(profile))
            print(f"round {r + 1}/{args.rounds}: {kind} {seconds[kind][-1]:.1f} s", file=sys.stderr)
    medians = {kind: statistics.median(values) for kind, values in seconds.items()}
    lines = [f"{args.rounds} rounds, each a start calibrating then one reusing its calibration", "",
             "| start | seconds to ready, round by round | median |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {kind} | {' '.join(f'{s:.1f}' for s in values)} | {medians[kind]:.1f} |"
              for kind, values in seconds.items()]  # fmt: skip
    lines += ["", f"Reusing / calibrating: {medians['reusing'] / medians['calibrating']:.2f}x the time.", "",
              f"Machine: {summary_line(machine)}."]  # fmt: skip
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
