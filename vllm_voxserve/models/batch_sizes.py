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


def powers_then_multiples(largest: int, step: int) -> tuple[int, ...]:
    """Powers of two below `step`, then every multiple of `step` up to `largest` (kept as the largest); `step` 0:
    powers of two all the way. A batch pads up to the next size, so the step bounds a large batch's padding."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step == 0:
        return powers_of_two_up_to(largest)
    small = [b for b in powers_of_two_up_to(largest) if b < step]
    return tuple(sorted({*small, *range(step, largest, step), largest}))


def smallest_at_least(options: Sequence[int], n: int) -> int:
    fitting = [o for o in options if o >= n]
    if not fitting:
        raise ValueError(f"{n} exceeds the largest prepared size {max(options)}")
    return min(fitting)
