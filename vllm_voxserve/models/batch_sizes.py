"""The batch sizes that graphs are captured for, and the one a batch of a given size runs in (padded up)."""

from __future__ import annotations

from collections.abc import Sequence


def powers_of_two_up_to(largest: int) -> tuple[int, ...]:
    if largest < 1:
        raise ValueError(f"largest batch must be >= 1, got {largest}")
    sizes, b = [], 1
    while b < largest:
        sizes.append(b)
        b *= 2
    return (*sizes, largest)


def smallest_at_least(options: Sequence[int], n: int) -> int:
    fitting = [o for o in options if o >= n]
    if not fitting:
        raise ValueError(f"{n} exceeds the largest prepared size {max(options)}")
    return min(fitting)
