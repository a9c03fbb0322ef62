"""Workload generators shared by the benchmarks: Veil's own, shaped after the workloads of the papers
whose figures are quoted beside them (docs/performance/peers.md says how each paper's differs)."""

from __future__ import annotations

import functools
import random
import time

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


# --- CUPUS sensors (S4 §6): OpenSense-like air-quality readings in Zürich -----------------------
SENSOR_READINGS = 4000  # the size of the seed's OpenSense sample
SENSOR_START = 1_420_070_400  # 2015-01-01, seconds; the readings span 30 days
SENSOR_SPAN = 30 * 86400
GASES = {"CO": (0.1, 8.0), "O3": (1.0, 120.0), "NO2": (1.0, 90.0), "UFP": (1_000.0, 80_000.0)}


@functools.cache
def sensor_readings() -> tuple[dict[str, object], ...]:
    """A fixed pool of readings that publications and subscriptions are both drawn from, as in S4."""
    rng = random.Random(4000)
    return tuple(
        {
            **{gas: round(rng.uniform(low, high), 3) for gas, (low, high) in GASES.items()},
            "lat": round(rng.uniform(47.32, 47.43), 5),
            "lon": round(rng.uniform(8.47, 8.60), 5),
            "timestamp": SENSOR_START + rng.randrange(SENSOR_SPAN),
        }
        for _ in range(SENSOR_READINGS)
    )


def sensor_subscription(rng: random.Random) -> list[dict]:
    """1-3 constraints taken from one reading, each with a random <, <=, >, >=; one in five also asks
    for a 1-6 h time window around it."""
    reading = rng.choice(sensor_readings())
    keys = rng.sample([*GASES, "lat", "lon"], rng.randint(1, 3))
    data = [{"key": k, "val": reading[k], "type": "double", "op": rng.choice(["lt", "le", "gt", "ge"])} for k in keys]
    if rng.random() < 0.2:
        start = int(reading["timestamp"]) - rng.randrange(3600)  # type: ignore[call-overload]
        window = [start, start + 3600 * rng.randint(1, 6)]
        data.append({"key": "timestamp", "val": window, "type": "long", "op": "between"})
    return data


def sensor_publication(rng: random.Random, run: str) -> dict:
    """A random reading of the pool; `t` (send time) lets the subscriber measure the delay."""
    return {**rng.choice(sensor_readings()), "run": run, "t": time.time()}
