"""The winner rule read back from finished searches: the cheapest within the noise against the best.

    python -m bench.quality.winner_rule quality/ other-quality/      # every search.log under them

Where the best candidate by validation objective passed the noise rule against the best baseline
but a cheaper candidate within its noise won (the log's ``best candidate ... not the winner: X is
within N standard error(s) of it and cheaper`` line), prints both models' test NE against the best
baseline's, and over all such searches how often and by how much each had the better test NE.
Searches where the two are the same model, or where no candidate passed, say nothing about the
choice and are skipped. Test NE is read, never used to choose: this is what the rule would have
returned either way.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from bench.common import parse_args

WINNER = re.compile(r"^winner \S+ \(candidate;.*?test/ne (?P<test>[\d.]+).*?vs \S+'s [\d.]+ and (?P<base>[\d.]+); "
                    r"better", re.M)
BEST = re.compile(r"^best candidate \S+ by validation objective: val/ne [\d.]+ \([-+\d.]+%\), "
                  r"test/ne (?P<test>[\d.]+) .*?not the winner: \S+ is within .* and cheaper", re.M)


def read(log: Path) -> tuple[float, float, float] | None:
    """``(best baseline's test NE, the winner's, the best candidate's)`` where they differ, else None."""
    text = log.read_text(errors="replace")
    winner, best = WINNER.search(text), BEST.search(text)
    if winner is None or best is None:
        return None
    return float(winner["base"]), float(winner["test"]), float(best["test"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, default=[Path("quality")],
                        help="folders searched for search.log files (default: quality)")
    args = parse_args(parser, {"folders": []}, argv)
    gaps = []
    for log in sorted(p for folder in args.folders for p in folder.rglob("search.log")):
        found = read(log)
        if found is None:
            continue
        base, cheap, best = found
        gaps.append(100 * (best - cheap) / base)
        print(f"{log.parent}: best baseline {base:.4f}; cheapest within the noise {cheap:.4f} "
              f"({100 * (cheap / base - 1):+.2f}%), best on validation {best:.4f} ({100 * (best / base - 1):+.2f}%)")
    if not gaps:
        print("no search where the two differ")
        return
    print(f"{len(gaps)} searches: the cheapest within the noise had the better test NE in {sum(g > 0 for g in gaps)}, "
          f"the best on validation in {sum(g < 0 for g in gaps)}; best minus cheapest "
          f"{statistics.fmean(gaps):+.2f}% of the best baseline's test NE on average")


if __name__ == "__main__":
    main()
