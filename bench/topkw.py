"""Top-k/w kernel: cost per publication against the window size and k, one core.

One subscription receives a stream of matching readings, one per millisecond, with uniformly random
scores; its window holds `window` of them. The k-skyband (S4 §4.4.2, veil.matching.kinds.topkw) is timed
against the approach it replaces: keep the whole window and take its k best again at every arrival
and expiry (heapq.nsmallest, which is cheaper than a full sort). Both must deliver the same readings
at the same moments, which is checked on the readings the baseline gets through.

`--scores worsening` is a hostile stream instead: each reading scores worse than the last, so none
is ever outranked by a younger one and the skyband holds the whole window (what bounds the count
window's `n`, `--max-window-count`).

    python -m bench.topkw [--k 1,10,100] [--windows 100,1000,10000,100000] [--scores random|worsening]
                          [--plot docs/performance/topkw.png]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from collections import deque

from bench.brokers import subscription_counts
from bench.report import add_plot_argument, print_table, save_figure
from veil.matching.kinds import Selected
from veil.matching.kinds.topkw import Skyband

BUDGET = 2.0  # seconds per measurement


class Resorting:
    """The window kept whole; its k best taken again whenever it changes."""

    def __init__(self, k: int, window: float) -> None:
        self.k, self.window = k, window
        self.held: deque[tuple[float, int, float]] = deque()  # (arrival, seq, score)
        self.delivered: set[int] = set()

    def _judge(self, now: float) -> list[Selected]:
        best = heapq.nsmallest(self.k, self.held, key=lambda item: (item[2], -item[1]))
        fresh = [Selected(seq, now) for _, seq, _ in best if seq not in self.delivered]
        self.delivered.update(d.seq for d in fresh)
        return fresh

    def arrive(self, seq: int, time: float, score: float) -> list[Selected]:
        delivered = []
        while self.held and self.held[0][0] + self.window <= time:
            moment = self.held[0][0] + self.window
            while self.held and self.held[0][0] + self.window == moment:
                self.held.popleft()
            delivered += self._judge(moment)
        self.held.append((time, seq, score))
        return delivered + self._judge(time)

    def fill(self, scores: list[float], delivered: list[Selected]) -> None:
        """Take the window as the skyband left it after the same readings, without judging each:
        filling by `arrive` is quadratic in the window (hours at 100,000)."""
        self.held.extend((seq, seq, score) for seq, score in enumerate(scores))
        self.delivered.update(d.seq for d in delivered)


def timed(matcher: Skyband | Resorting, scores: list[float], window: int) -> tuple[float, list[Selected], int]:
    """Microseconds per reading over the stream after the window first fills (until the budget or
    the stream ends); the deliveries after it filled; the time of the last reading."""
    delivered: list[Selected] = []
    started = time.perf_counter()
    done = window
    while done < len(scores) and time.perf_counter() - started < BUDGET:
        for seq in range(done, min(done + 32, len(scores))):
            delivered += matcher.arrive(seq, seq, scores[seq])
        done = min(done + 32, len(scores))
    return (time.perf_counter() - started) / (done - window) * 1e6, delivered, done - 1


def run(k: int, window: int, rng: random.Random, worsening: bool) -> dict:
    stream = window + 202_000  # the last 2,000 only for the skyband's size
    every = [float(seq) for seq in range(stream)] if worsening else [rng.random() for _ in range(stream)]
    scores = every[:-2000]
    band = Skyband(k, window)
    filled = [d for seq in range(window) for d in band.arrive(seq, seq, scores[seq])]
    skyband_us, got, last = timed(band, scores, window)
    sizes = []
    for seq in range(last + 1, last + 2001):
        got += band.arrive(seq, seq, every[seq])
        sizes.append(len(band))
    resorting = Resorting(k, window)
    resorting.fill(scores[:window], filled)
    resort_us, expected, reached = timed(resorting, scores, window)
    assert [d for d in got if d.time <= reached] == expected, "the skyband and the re-sorted window disagree"
    return {
        "k": k,
        "window": window,
        "skyband": skyband_us,
        "size": statistics.fmean(sizes),
        "resort": resort_us,
        "delivered": (len(filled) + len(got)) / (last + 2001),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=subscription_counts, default=[1, 10, 100])
    parser.add_argument("--windows", type=subscription_counts, default=[100, 1000, 10000, 100000])
    parser.add_argument("--scores", choices=["random", "worsening"], default="random")
    add_plot_argument(parser, "topkw")
    args = parser.parse_args()
    rng = random.Random(5)
    rows = []
    for k in args.k:
        for window in args.windows:
            if k < window:
                rows.append(run(k, window, rng, args.scores == "worsening"))
                print(rows[-1], flush=True)
    print_table(
        f"Top-k/w, one subscription, one reading per ms, {args.scores} scores; microseconds per reading, one core",
        [
            ("k", 5, lambda r: r["k"]),
            ("window", 8, lambda r: r["window"]),
            ("skyband us", 11, lambda r: f"{r['skyband']:.2f}"),
            ("band size", 10, lambda r: f"{r['size']:.0f}"),
            ("re-sort us", 11, lambda r: f"{r['resort']:.1f}"),
            ("speed-up", 9, lambda r: f"{r['resort'] / r['skyband']:.0f}x"),
            ("delivered", 10, lambda r: f"{r['delivered']:.4f}"),
        ],
        rows,
    )

    def draw(axes: list) -> None:
        (ax,) = axes
        for k in args.k:
            mine = [r for r in rows if r["k"] == k]
            shown = [r["window"] for r in mine]
            ax.loglog(shown, [r["skyband"] for r in mine], "o-", label=f"k-skyband, k={k}")
            ax.loglog(shown, [r["resort"] for r in mine], "x--", label=f"re-sorting the window, k={k}")
        ax.set(xlabel="readings in the window", ylabel="µs per reading", title="Top-k/w matching, one core")

    save_figure(args.plot, draw)


if __name__ == "__main__":
    main()
