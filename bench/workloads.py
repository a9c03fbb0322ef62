"""Workload generators shared by the benchmarks (SPEC §11 "Benchmark workloads")."""

from __future__ import annotations

import random

ORDER_IDS = 100_000


def logistics_subscription(rng: random.Random) -> list[tuple[str, str, object]]:
    """`orderId eq <one id>` plus 0-2 range constraints on lat/lon/temperature."""
    predicates: list[tuple[str, str, object]] = [("orderId", "eq", f"ORD{rng.randrange(ORDER_IDS):06d}")]
    for key in rng.sample(["lat", "lon", "temperature"], rng.randint(0, 2)):
        low = rng.uniform(-10, 60)
        op = rng.choice(["gt", "lt", "between"])
        predicates.append((key, op, [low, low + 30] if op == "between" else low))
    return predicates


def logistics_publication(rng: random.Random) -> dict[str, object]:
    """An order position; one in ten carries an id nobody subscribed to."""
    order = rng.randrange(ORDER_IDS * 11 // 10)
    return {
        "orderId": f"ORD{order:06d}",
        "lat": rng.uniform(-10, 90),
        "lon": rng.uniform(-10, 90),
        "temperature": rng.uniform(-10, 90),
        "carrier": rng.choice(["MED FRIGO", "NORDIC", "IBERIA"]),
    }
