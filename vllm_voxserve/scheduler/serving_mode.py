"""vLLM's own scheduling as a serving mode, `vllm-stock` (the ablation baseline: vLLM's scheduler, codec inline).

The mode call of `GET /voxserve/modes` / `POST /voxserve/mode` passes the engine core on its way to the workers
(`compat.route_mode_rpc_through_scheduler`). Here it is split: the codec mode goes on to the workers (`inline` for
`vllm-stock`), the choice of policy stays with the scheduler, which runs vLLM's own code untouched while in stock
mode. Replies keep the workers' shape (`{"status", "modes", "current", ...}`, one per worker). Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

STOCK_MODE = "vllm-stock"
STOCK_CODEC_MODE = "inline"


class ModeScheduler(Protocol):
    stock: bool

    def has_requests(self) -> bool: ...

    def set_stock(self, stock: bool) -> None: ...


def handle_mode_call(scheduler: ModeScheduler, mode: str | None,
                     forward: Callable[[str | None], list[dict]]) -> list[dict]:
    """Report (mode None) or switch; `forward(codec_mode)` asks every worker and returns their replies."""
    if mode is None:
        return [_with_stock(reply, scheduler.stock) for reply in forward(None)]
    if scheduler.has_requests():
        busy = "requests are running; switch the serving mode when idle"
        return [{**_with_stock(reply, scheduler.stock), "status": 409, "error": busy} for reply in forward(None)]
    replies = forward(STOCK_CODEC_MODE if mode == STOCK_MODE else mode)
    if all(reply.get("status") == 200 for reply in replies):
        scheduler.set_stock(mode == STOCK_MODE)
    return [_with_stock(reply, scheduler.stock) for reply in replies]


def _with_stock(reply: dict, stock: bool) -> dict:
    reply = dict(reply)
    if "modes" in reply:
        reply["modes"] = [*reply["modes"], STOCK_MODE] if STOCK_MODE not in reply["modes"] else reply["modes"]
    if stock and reply.get("current") == STOCK_CODEC_MODE:
        reply["current"] = STOCK_MODE
    return reply
