"""How the benchmarks print their tables and save their plots."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

Column = tuple[str, int, Callable[[dict], object]]


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


@contextlib.contextmanager
def figure(path: str, columns: int = 1, legend: dict | None = None) -> Iterator[list]:
    """Axes to draw on; the figure is written to `path` (PNG) when the block ends (`legend`: where
    and how matplotlib places the legends)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, columns, figsize=(5 * columns + 1, 4), squeeze=False)
    yield list(axes[0])
    for ax in axes[0]:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(**(legend or {}))
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")
