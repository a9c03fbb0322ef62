"""How the benchmarks print their tables and save their plots."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from typing import Any

Column = tuple[str, int, Callable[[dict], object]]
PLOTS = os.path.join(tempfile.gettempdir(), "veil-bench")
QUOTED = "docs/performance/peers.md"  # where every quoted figure's source is given


def print_table(title: str, columns: list[Column], rows: list[dict]) -> None:
    """Right-aligned columns (header, width, value of a row); a value of None prints as '-'."""
    print(f"\n{title}")
    header = " ".join(f"{name:>{width}}" for name, width, _ in columns)
    print(header)
    print("-" * len(header))
    for row in rows:
        cells = []
        for _, width, value in columns:
            shown = value(row)
            cells.append(f"{'-' if shown is None else shown:>{width}}")
        print(" ".join(cells), flush=True)


def print_quoted(title: str, figures: list[tuple[str, str, str]]) -> None:
    """Figures other systems' papers or peer runs report, printed apart from what this run measured
    so that a reader never takes one for the other: (what, figure, where it is quoted from)."""
    print(f"\nQuoted, not measured here: {title} (sources: {QUOTED})")
    width = max(len(what) for what, _, _ in figures)
    for what, figure, source in figures:
        print(f"  {what:<{width}}  {figure:>12}  {source}")


def add_plot_argument(parser: argparse.ArgumentParser, name: str) -> None:
    """`--plot`, by default outside the repository: the plots in docs/performance/ are published
    beside tables measured at a known commit, so only a run that asks to replace one does."""
    parser.add_argument(
        "--plot",
        default=os.path.join(PLOTS, f"{name}.png"),
        help=f"PNG to write ('' for none); `--plot docs/performance/{name}.png` replaces the published plot",
    )


def save_figure(path: str, draw: Callable[[list], None], columns: int = 1, legend: dict | None = None) -> None:
    """Let `draw` fill `columns` axes and write the figure to `path` (PNG; `legend`: where and how
    matplotlib places the legends). matplotlib is an extra: without it the run says how to get the
    plot instead of ending in a traceback after its table."""
    if not path:
        return
    try:
        import matplotlib
    except ModuleNotFoundError:
        print(f'\nno plot for {path}: matplotlib is missing (`pip install -e ".[bench]"` adds it)')
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, columns, figsize=(5 * columns + 1, 4), squeeze=False)
    draw(list(axes[0]))
    for ax in axes[0]:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(**(legend or {}))
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot: {path}")


def draw_quoted(ax: Any, xs: list, ys: list, label: str, marker: str = "s") -> None:
    """A quoted figure on a plot: grey, hollow and dotted, labelled as quoted, so that it never reads
    as one of the measured series beside it (`marker` tells several quoted series apart)."""
    ax.plot(xs, ys, f"{marker}:", color="grey", markerfacecolor="none", label=f"quoted: {label}")
