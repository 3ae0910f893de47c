"""Serving modes: the codec mode, vLLM's own scheduling (`vllm-stock`) and the admission policy, switched live.

Names: a worker codec mode (`inline`, `lanes`) runs our policy with the configured admission mode;
`CODEC+ADMISSION` (e.g. `lanes+prefill_first`) runs it with that admission mode instead (the paper's §4.7 ablation of
deadline-aware scheduling, on the same server); `vllm-stock` is vLLM's own scheduler with the codec inline (the
baseline).

The mode call of `GET /voxserve/modes` / `POST /voxserve/mode` passes the engine core on its way to the workers
(`compat.route_mode_rpc_through_scheduler`). Here it is split: the codec mode goes on to the workers, the choice
of policy stays with the scheduler, which runs vLLM's own code untouched while in stock mode. Replies keep the
workers' shape (`{"status", "modes", "current", ...}`, one per worker). Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from vllm_voxserve.scheduler.policy_config import ADMISSION_MODES

STOCK_MODE = "vllm-stock"
STOCK_CODEC_MODE = "inline"
ADMISSION_SEPARATOR = "+"


class ModeScheduler(Protocol):
    stock: bool
    admission_mode: str  # the one in force
    configured_admission_mode: str  # the one a plain codec mode name runs

    def has_requests(self) -> bool: ...

    def set_policy(self, stock: bool, admission_mode: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ServingMode:
    codec_mode: str  # what the workers run
    stock: bool
    admission_mode: str | None  # None: the configured one


def parse_mode(name: str) -> ServingMode:
    """Raises ValueError for an admission suffix that is not one of ADMISSION_MODES (codec modes are the workers')."""
    if name == STOCK_MODE:
        return ServingMode(STOCK_CODEC_MODE, True, None)
    codec_mode, sep, admission = name.partition(ADMISSION_SEPARATOR)
    if not sep:
        return ServingMode(name, False, None)
    if admission not in ADMISSION_MODES:
        raise ValueError(f"unknown admission mode {admission!r} in {name!r}; valid: {list(ADMISSION_MODES)}")
    return ServingMode(codec_mode, False, admission)


def handle_mode_call(scheduler: ModeScheduler, mode: str | None,
                     forward: Callable[[str | None], list[dict]]) -> list[dict]:
    """Report (mode None) or switch; `forward(codec_mode)` asks every worker and returns their replies."""
    if mode is None:
        return [_named(reply, scheduler) for reply in forward(None)]
    try:
        wanted = parse_mode(mode)
    except ValueError as exc:
        return [{**_named(reply, scheduler), "status": 400, "error": str(exc)} for reply in forward(None)]
    if scheduler.has_requests():
        busy = "requests are running; switch the serving mode when idle"
        return [{**_named(reply, scheduler), "status": 409, "error": busy} for reply in forward(None)]
    replies = forward(wanted.codec_mode)
    refused = [reply for reply in replies if reply.get("status") != 200]
    if not refused:
        scheduler.set_policy(wanted.stock, wanted.admission_mode or scheduler.configured_admission_mode)
    elif len(refused) < len(replies) and refused[0].get("current"):
        # some workers switched, one could not (e.g. no memory on its GPU): put them back, so every worker runs the
        # mode they all ran before and the server is as it was
        forward(refused[0]["current"])
    return [_named(reply, scheduler) for reply in replies]


def _named(reply: dict, scheduler: ModeScheduler) -> dict:
    """The workers' reply with serving-mode names: the stock mode and the other admission modes listed, the
    current mode named as the scheduler runs it."""
    reply = dict(reply)
    configured = scheduler.configured_admission_mode
    if "modes" in reply:
        codec_modes = [m for m in reply["modes"] if m != STOCK_MODE]
        others = [f"{m}{ADMISSION_SEPARATOR}{a}" for m in codec_modes for a in ADMISSION_MODES if a != configured]
        reply["modes"] = [*codec_modes, STOCK_MODE, *others]
    current = reply.get("current")
    if scheduler.stock and current == STOCK_CODEC_MODE:
        reply["current"] = STOCK_MODE
    elif current is not None and not scheduler.stock and scheduler.admission_mode != configured:
        reply["current"] = f"{current}{ADMISSION_SEPARATOR}{scheduler.admission_mode}"
    return reply
