"""Which data-parallel rank takes a speech request, and where a refused one goes next. Pure: no vLLM, no clock.

With `--data-parallel-size N` each rank's engine core admits by its own capacity model, so one rank may refuse a
request that another has room for. The API server therefore chooses the rank itself: the rank with the fewest of
its own open streams (a request holds its rank's codec slots until its audio ends, after vLLM's running count has
let it go), skipping ranks that refused lately. A refused request goes to the next rank it has not tried; the client
gets 503 only when every rank has refused it, with the soonest Retry-After among them.

A refusal marks its rank full until its Retry-After passes or one of the rank's streams from this API server ends
(a slot freed), so that arrivals meanwhile try the other ranks first instead of paying a round trip to a full one.
With several API servers each counts its own streams: the counts balance each server's share, the retries the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class RankChoice:
    num_ranks: int
    open_streams: list[int] = field(init=False)
    full_until: list[float] = field(init=False)  # monotonic seconds; -inf: not known to be full
    _start: int = field(init=False, default=0)  # where ties start, rotating so that idle ranks take turns

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be at least 1, got {self.num_ranks}")
        self.open_streams = [0] * self.num_ranks
        self.full_until = [-math.inf] * self.num_ranks

    def pick(self, now: float, tried: set[int] | frozenset[int] = frozenset()) -> int | None:
        """The rank for a request that `tried` ranks have refused; None when all have."""
        candidates = [rank for rank in range(self.num_ranks) if rank not in tried]
        if not candidates:
            return None
        rank = min(candidates, key=lambda r: (self.full_until[r] > now, self.open_streams[r],
                                              (r - self._start) % self.num_ranks))
        self._start = (rank + 1) % self.num_ranks
        return rank

    def opened(self, rank: int) -> None:
        """A request was sent to `rank`."""
        self.open_streams[rank] += 1

    def refused(self, rank: int, now: float, retry_after_s: float) -> None:
        """`rank` refused the request it was sent: full for `retry_after_s`, unless one of its streams ends first."""
        self.open_streams[rank] -= 1
        self.full_until[rank] = max(self.full_until[rank], now + retry_after_s)

    def closed(self, rank: int) -> None:
        """A request `rank` took has ended (its audio, an error, or its client leaving): it has a slot free again."""
        self.open_streams[rank] -= 1
        self.full_until[rank] = -math.inf
