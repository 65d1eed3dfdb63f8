"""``python -m benchmarks``: run the workloads and print their rows as a table."""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import OPT_IN, WORKLOADS, Options, format_rows, run

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the workloads, print the table; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description="seqloader against torch.utils.data.DataLoader, workload by workload")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {', '.join(WORKLOADS)} (default: all of these), "
                             f"or of the opt-in {', '.join(OPT_IN)}")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement; the best is kept")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS and w not in OPT_IN]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)} (expected some of {', '.join([*WORKLOADS, *OPT_IN])})")
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1 (got {args.repeat})")
    torch.set_num_threads(1)
    print(format_rows(run(names, Options(quick=args.quick, repeat=args.repeat)), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
