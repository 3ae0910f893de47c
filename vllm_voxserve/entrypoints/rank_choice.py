"""Which data-parallel rank takes a speech request, and where a refused one goes next. Pure: no vLLM, no clock.

With `--data-parallel-size N` each rank's engine core admits by its own capacity model, so one rank may refuse a
request that another has room for. The API server therefore chooses the rank itself: the rank with the fewest of
its own open streams (a request holds its rank's codec slots until its audio ends, after vLLM's running count has
let it go), skipping ranks that refused lately. A refused request goes to the next rank it has not tried; the client
gets 503 only when every rank has refused it, with the soonest Retry-After among them.

A refusal marks its rank full until its Retry-After passes or one of the rank's streams from this API server ends
(a slot freed), so that arrivals meanwhile try the other ranks first instead of paying a round trip to a full one.
A refusal for the number of requests in progress alone (the scheduler's in-progress limit) instead marks the rank
full, for `LIMIT_MARK_S` at most, whenever this API server has as many streams open on it as when it refused: such a
rank would refuse the next arrival too. While every rank is so marked, `at_limit` tells the route to refuse
an arrival before reading it: an answer in milliseconds instead of a wait for the engine core's next step, and the
engine core never hears of it (unless `refuse_at_limit` is off: where vLLM routes among several engines, the one
that refused may not be the next one asked). A refusal for the load's frames or first audio marks no count: it
depends on the request refused (one very long request says nothing about the next).
With several API servers each counts its own streams: the counts balance each server's share, the retries the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# How long a refusal by a rank's in-progress limit stands for it here. The limit may rise once each of its windows
# (`ConcurrencyLimit`, 0.5 s), and with several API servers the rank's count also falls as other servers' streams
# end, unseen here: after this the next arrival asks the rank again, one round trip each time the mark lapses.
LIMIT_MARK_S = 0.25


@dataclass
class RankChoice:
    num_ranks: int
    refuse_at_limit: bool = True  # `at_limit` may answer (the ranks here are all the engines this server reaches)
    open_streams: list[int] = field(init=False)
    full_until: list[float] = field(init=False)  # monotonic seconds; -inf: not known to be full
    # by its in-progress limit: full while it has `limit_streams` open here, until `limit_until`
    limit_streams: list[int] = field(init=False)
    limit_until: list[float] = field(init=False)
    _start: int = field(init=False, default=0)  # where ties start, rotating so that idle ranks take turns

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be at least 1, got {self.num_ranks}")
        self.open_streams = [0] * self.num_ranks
        self.full_until = [-math.inf] * self.num_ranks
        self.limit_streams = [0] * self.num_ranks
        self.limit_until = [-math.inf] * self.num_ranks

    def pick(self, now: float, tried: set[int] | frozenset[int] = frozenset()) -> int | None:
        """The rank for a request that `tried` ranks have refused; None when all have."""
        candidates = [rank for rank in range(self.num_ranks) if rank not in tried]
        if not candidates:
            return None
        rank = min(candidates, key=lambda r: (self.full_until[r] > now or self._at_limit(r, now),
                                              self.open_streams[r], (r - self._start) % self.num_ranks))
        self._start = (rank + 1) % self.num_ranks
        return rank

    def opened(self, rank: int) -> None:
        """A request was sent to `rank`."""
        self.open_streams[rank] += 1

    def refused(self, rank: int, now: float, retry_after_s: float, by_limit: bool = False) -> None:
        """`rank` refused the request it was sent: full for `retry_after_s`, unless one of its streams ends first;
        `by_limit` (its in-progress limit): full for `LIMIT_MARK_S` (at most `retry_after_s`) whenever it has as
        many streams open as now."""
        self.open_streams[rank] -= 1
        if by_limit:
            self.limit_streams[rank] = self.open_streams[rank]
            self.limit_until[rank] = now + min(retry_after_s, LIMIT_MARK_S)
        else:
            self.full_until[rank] = max(self.full_until[rank], now + retry_after_s)

    def at_limit(self, now: float) -> tuple[int, float] | None:
        """(streams open here, seconds until a rank's mark lapses) while every rank is full by its in-progress
        limit, so that an arrival would only be refused; None while some rank may take it."""
        if not self.refuse_at_limit or not all(self._at_limit(rank, now) for rank in range(self.num_ranks)):
            return None
        return sum(self.open_streams), min(self.limit_until) - now

    def _at_limit(self, rank: int, now: float) -> bool:
        return now < self.limit_until[rank] and self.open_streams[rank] >= self.limit_streams[rank]

    def closed(self, rank: int) -> None:
        """A request `rank` took has ended (its audio, an error, or its client leaving): it has a slot free again."""
        self.open_streams[rank] -= 1
        self.full_until[rank] = -math.inf
