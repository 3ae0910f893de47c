"""Per-step inputs of the Qwen3-TTS talker inside vLLM, in persistent device buffers.

vLLM samples codebook 0 after the forward, while the code predictor needs that sample: so a decode row runs the
code predictor at the start of the *next* forward, from the talker hidden state stashed by the previous one
(indexed by the request's slot) and the sampled token vLLM feeds back as the row's input id. Everything the
forward reads is a fixed buffer filled on the host before it, so the same forward can be captured in a CUDA graph.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from vllm_voxserve.models.seeded_noise import noise_base_on_host, seed_half_on_host
from vllm_voxserve.models.step_layout import StepLayout

from .text_track import TextTrack


# The integer, boolean and float buffers of a step, by name: each is a column of one [max_tokens, k] tensor per dtype
# on the device and in the host staging, so that a step's first n rows of all of them go over in one copy per dtype
# (with a copy per buffer, queueing the copies took 0.41 ms of host time a step at ~180 rows on the H200:
# 2026-12-04_b7fcaeb's `prepare copies us`).
_INT_ROWS = ("text_ids", "read_slot", "write_slot", "cp_top_k", "seed", "frame_index",
             "sample_row", "sample_slot", "sample_noise_base", "sample_step", "sample_top_k")
_BOOL_ROWS = ("is_decode", "suppress_eos")
_FLOAT_ROWS = ("cp_temperature", "cp_top_p", "sample_temperature", "sample_top_p", "sample_penalty")
# A request's constants, one row per slot (its slot's request), so that a step gathers them for all its rows at once:
# codebook 0's text pad, fixed length, seed's noise half, top-k; the code predictor's top-k and seed. And the floats:
# codebook 0's temperature, top-p, repetition penalty; the code predictor's temperature and top-p.
_PAD, _FIXED, _SEED_HALF, _TOP_K, _CP_TOP_K, _SEED = range(6)
_TEMPERATURE, _TOP_P, _PENALTY, _CP_TEMPERATURE, _CP_TOP_P = range(5)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# fill's per-request hook (tests' fault injection): called with the request and its frame count before its rows
RowCheck = Callable[["ServedRequest", int], None]


class _HostStaging:
    """One step's host copy of the buffers `fill` writes, in page-locked memory on GPU so that each host-to-device
    copy is only queued (a pageable copy waits for the driver to stage it). Two of them alternate: one may
    still be read by queued copies while the next step fills the other, and `claim` waits for the copies of the step
    before last (normally long done)."""

    def __init__(self, max_tokens: int, max_decode_rows: int, pinned: bool):
        def make(shape, dtype):
            return torch.zeros(shape, dtype=dtype, pin_memory=pinned)

        self.ints = make((max_tokens, len(_INT_ROWS)), torch.long)  # row: a token; column: a buffer
        self.bools = make((max_tokens, len(_BOOL_ROWS)), torch.bool)
        self.floats = make((max_tokens, len(_FLOAT_ROWS)), torch.float32)
        self.decode_index = make((max_decode_rows,), torch.long)
        self.copied = torch.cuda.Event() if pinned else None  # recorded after this staging's copies are queued

    def claim(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()


_SERIALS = itertools.count(1)  # 0: no request


@dataclass(slots=True)
class ServedRequest:
    """Host-side state of one request while vLLM runs it."""

    req_id: str
    slot: int
    prompt_len: int
    prefill_embeds: torch.Tensor  # [prompt_len, H] on the device
    decode_text_ids: tuple[int, ...]  # text id added at decode step k (then tts_pad)
    tts_pad_id: int
    fixed_length: bool
    cp_temperature: float
    cp_top_k: int
    cp_top_p: float
    seed: int  # the draws for frame k (codebook 0 and the code predictor's) come from (seed, k): batch-independent
    # codebook 0's temperature, top_k, top_p and repetition penalty (greedy for placeholders)
    talker_sampling: tuple[float, int, float, float] = (0.0, 0, 1.0, 1.0)
    failed: str | None = None
    # Preemption: vLLM recomputes a preempted request from its first token. Its finished frames (each as the step's
    # codes tensor [n, 16] on the device and its row there) give the inputs of its generated positions; while
    # `resuming`, its slot keeps the hidden state its pending token came from (the stash the pending decode row
    # reads), so no other row of it may overwrite it.
    frames: list = field(default_factory=list)
    prefill_done: bool = False
    resuming: bool = False
    noise_seed_half: int = 0  # its seed's half of codebook 0's counter noise (`seeded_noise.seed_half_on_host`)
    serial: int = field(default=0, init=False)  # unique in this process: which request a slot's constants are of
    text_track: TextTrack | None = None  # text arriving while it runs: the decode steps' text ids come from here

    def __post_init__(self) -> None:
        # Every step writes these into int64 / float32 rows shared by the whole batch: a value that does not fit
        # must fail this request here, never the step's batch write.
        for name in ("seed", "cp_top_k"):
            value = getattr(self, name)
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise ValueError(f"{name} {value} is outside the signed 64-bit range")
        self.noise_seed_half = seed_half_on_host(self.seed)
        self.serial = next(_SERIALS)

    def decode_text_id(self, step: int) -> int:
        if self.text_track is not None:
            return self.text_track.decode_text_id(step)  # TextNotArrived: the scheduler ran a paused request
        return self.decode_text_ids[step] if step < len(self.decode_text_ids) else self.tts_pad_id


class DecodeRow(NamedTuple):  # a tuple: one is made per decode row of every step
    row: int  # row in this step's flattened tokens
    req_id: str
    frame_index: int  # the request's frame number that this row completes


class StepBuffers:
    """Device buffers for up to `max_tokens` rows; `fill` writes one step's layout into them."""

    def __init__(self, max_tokens: int, max_slots: int, hidden_size: int, dtype: torch.dtype, device,
                 vocab_size: int):
        self.max_tokens = max_tokens
        self.scratch_slot = max_slots  # rows that must not touch a request's stash write here
        kw = {"device": device}
        # A step has at most one decode row per request; the code predictor runs on at least two rows (a batch of
        # one would make torch.compile specialise the batch size).
        self.max_decode_rows = max(max_slots, 2)
        # The rows the code predictor runs on (decode rows, padded by repeating the first): prefill rows skip it.
        self.decode_row_index = torch.zeros(self.max_decode_rows, dtype=torch.long, **kw)
        # The code predictor's codebook-0 input and codebooks 1..15 output, per decode row (fixed addresses).
        self.cp_c0 = torch.zeros(self.max_decode_rows, dtype=torch.long, **kw)
        self.cp_codes = torch.zeros(self.max_decode_rows, 15, dtype=torch.long, **kw)
        self.prefill_embeds = torch.zeros(max_tokens, hidden_size, dtype=dtype, **kw)
        # One value per row of the step, each a column of its dtype's block (see _INT_ROWS): the decode rows' text
        # id, the slot whose stash a row reads and the one it writes (the scratch slot: none), the code predictor's
        # settings, seed and frame index, whether a row decodes. Per request row of compute_logits (a sample row):
        # whether EOS is suppressed (fixed length), the request's last row of the step (the row vLLM samples), its
        # slot, the (seed, draw) half of its counter noise (`seeded_noise.noise_base_on_host`; the draw is the
        # number of tokens it has generated), that draw and codebook 0's settings.
        self._ints = torch.zeros(max_tokens, len(_INT_ROWS), dtype=torch.long, **kw)
        self._bools = torch.zeros(max_tokens, len(_BOOL_ROWS), dtype=torch.bool, **kw)
        self._floats = torch.zeros(max_tokens, len(_FLOAT_ROWS), dtype=torch.float32, **kw)
        for block, names in ((self._ints, _INT_ROWS), (self._bools, _BOOL_ROWS), (self._floats, _FLOAT_ROWS)):
            for i, name in enumerate(names):
                setattr(self, name, block[:, i])
        self.write_slot.fill_(max_slots)
        for name in ("cp_top_p", "sample_top_p", "sample_penalty"):
            getattr(self, name).fill_(1.0)
        # per slot, the codebook-0 ids its request generated (its repetition penalty)
        self.seen = torch.zeros(max_slots + 1, vocab_size, dtype=torch.bool, **kw)
        # The forward's draw for compute_logits: per sample row, 0 at the drawn id and -inf elsewhere; and how many
        # sample rows the last fill wrote (one per request of the step).
        self.codebook0_logits = torch.zeros(self.max_decode_rows, vocab_size, dtype=torch.float32, **kw)
        self.sample_rows = 0
        # Outputs of the forward: the hidden state stash (one row per slot + scratch) and each row's frame codes.
        self.stash = torch.zeros(max_slots + 1, hidden_size, dtype=dtype, **kw)
        self.frame_codes = torch.zeros(max_tokens, 16, dtype=torch.long, **kw)
        # Per slot, the constants of the request that holds it (written when fill first sees it there; its serial
        # says which request that was, without keeping a finished one alive); the scratch slot's row is a
        # placeholder's (greedy, no text pad: its noise and rows are never kept).
        self._slot_ints = np.zeros((max_slots + 1, 6), dtype=np.int64)
        self._slot_floats = np.zeros((max_slots + 1, 5), dtype=np.float32)
        self._slot_ints[max_slots, _SEED_HALF] = seed_half_on_host(0)
        self._slot_floats[max_slots, [_TOP_P, _PENALTY, _CP_TOP_P]] = 1.0
        self._slot_owner = [0] * (max_slots + 1)
        pinned = torch.device(device).type == "cuda"
        self._staging = [_HostStaging(max_tokens, self.max_decode_rows, pinned) for _ in range(2 if pinned else 1)]
        self.last_wait_s = self.last_copies_s = 0.0  # parts of the last fill's host time, for the step log
        self._fills = 0

    def _hold_constants(self, req: ServedRequest) -> None:
        """Write the constants of `req` into its slot's rows (the slot's previous request has finished)."""
        temperature, top_k, top_p, penalty = req.talker_sampling
        self._slot_ints[req.slot] = (req.tts_pad_id, req.fixed_length, req.noise_seed_half, top_k, req.cp_top_k,
                                     req.seed)
        self._slot_floats[req.slot] = (temperature, top_p, penalty, req.cp_temperature, req.cp_top_p)
        self._slot_owner[req.slot] = req.serial

    def _fill_prompt_and_replay(self, row: int, req: ServedRequest, start: int, count: int,
                                replay_embed) -> int | None:
        """Rows of a prefill chunk: prompt rows, and (a preempted request being recomputed) replayed generated
        positions. Returns the position of the chunk's decode row (its newest token), if it has one."""
        if start == 0 and req.prefill_done:
            req.resuming = True  # recomputed after a preemption
        last = start + count - 1
        # The chunk's last row is the request's newest token (a decode row) unless it replays a finished frame.
        decode_at = last if last - req.prompt_len >= len(req.frames) else None
        stop = min(start + count, req.prompt_len)
        if stop > start:
            self.prefill_embeds[row : row + stop - start].copy_(req.prefill_embeds[start:stop])
            req.prefill_done |= stop == req.prompt_len
        for position in range(max(start, req.prompt_len), last + 1 if decode_at is None else decode_at):
            k = position - req.prompt_len
            if replay_embed is None or k >= len(req.frames):
                req.failed = f"cannot recompute generated position {k} (frames known: {len(req.frames)})"
                self.prefill_embeds[row + position - start].zero_()
            else:
                self.prefill_embeds[row + position - start].copy_(replay_embed(req, k))
        return decode_at

    def fill(self, layout: StepLayout, requests: dict[str, ServedRequest],
             replay_embed: Callable[[ServedRequest, int], torch.Tensor] | None = None,
             row_check: RowCheck | None = None) -> list[DecodeRow]:
        """Write a step's inputs; returns the decode rows (each completes one frame of its request).

        replay_embed(req, k): the input [H] of generated position k of `req` (its frame k and text), for a
        preempted request's recomputation. A request whose own rows cannot be written gets `failed` set and, like
        one already failed, rows that keep nothing (no stash write, no frame): the rest of the batch runs on."""
        n = layout.total_tokens
        if n > self.max_tokens:
            raise ValueError(f"step has {n} tokens, buffers hold {self.max_tokens}")
        staging = self._staging[self._fills % len(self._staging)]
        self._fills += 1
        started = time.perf_counter()
        staging.claim()
        claimed = time.perf_counter()
        self.last_wait_s = claimed - started  # host blocked until the copies of two steps ago had run
        # numpy views with one row per buffer, as the code below indexes them
        ints, bools, floats = staging.ints.numpy().T, staging.bools.numpy().T, staging.floats.numpy().T
        ints[:, : n + 1] = 0
        ints[_INT_ROWS.index("write_slot"), : n + 1] = self.scratch_slot
        bools[:, : n + 1] = False
        floats[0, : n + 1], floats[1, : n + 1] = 0.0, 1.0
        text_ids, read_slot, write_slot, top_k, seed, frame_index, s_row, s_slot, s_base, s_step, s_top_k = ints
        is_decode, suppress = bools
        decode_rows: list[DecodeRow] = []
        # Per request: its slot (0 for rows that keep nothing), its constants' row (the scratch slot's for those) and
        # codebook 0's draw; per decode row: its row, text id, step and slot. Written to the arrays at once.
        slots, table_rows, draws, stash_rows, stash_slots = [], [], [], [], []
        d_rows, d_text, d_step, d_slots = [], [], [], []
        owners, scratch = self._slot_owner, self.scratch_slot
        row = 0
        for req_id, count, start in zip(layout.req_ids, layout.num_tokens, layout.start_positions, strict=True):
            req = requests.get(req_id)
            decode_at = text_id = None
            if req is not None and req.failed is None:
                try:
                    if owners[req.slot] != req.serial:
                        self._hold_constants(req)  # a value that does not fit its row fails this request here
                    if row_check is not None:
                        row_check(req, len(req.frames))
                    if count == 1 and start - req.prompt_len >= len(req.frames) and start >= req.prompt_len:
                        decode_at = start  # the usual decode row (the hot path)
                    else:
                        decode_at = self._fill_prompt_and_replay(row, req, start, count, replay_embed)
                    if decode_at is not None:
                        text_id = req.decode_text_id(decode_at - req.prompt_len)
                except Exception as exc:  # noqa: BLE001 - one request's rows must not fail the step
                    req.failed = f"step set-up failed: {type(exc).__name__}: {exc}"
            if req is None or req.failed is not None:
                # a warm-up or dummy batch of vLLM's, or a failed request: rows compute nothing that is kept
                slots.append(0), table_rows.append(scratch), draws.append(0)
                row += count
                continue
            slot = req.slot
            # the draw is the number of tokens generated before this step's sample (negative for a partial prefill,
            # whose sample vLLM discards)
            slots.append(slot), table_rows.append(slot), draws.append(start + count - req.prompt_len)
            if decode_at is not None:
                r, step = row + decode_at - start, decode_at - req.prompt_len
                d_rows.append(r), d_text.append(text_id), d_step.append(step), d_slots.append(slot)
                decode_rows.append(DecodeRow(r, req_id, step))
                req.resuming = False
            # The last row's hidden state feeds the next frame; a resuming request keeps its stash until it decodes.
            if decode_at is not None or not req.resuming:
                stash_rows.append(row + count - 1), stash_slots.append(slot)
            row += count
        m = len(slots)  # one codebook-0 sample (a request row of compute_logits) per request
        counts = np.asarray(layout.num_tokens, dtype=np.int64)
        read_slot[:n] = np.repeat(np.asarray(slots, dtype=np.int64), counts)
        table = np.asarray(table_rows, dtype=np.int64)
        held_ints, held_floats = self._slot_ints[table], self._slot_floats[table]
        text_ids[:n] = np.repeat(held_ints[:, _PAD], counts)
        suppress[:m] = held_ints[:, _FIXED] != 0
        if m:
            s_row[:m] = np.cumsum(counts) - 1
            s_slot[:m], s_step[:m], s_top_k[:m] = table, draws, held_ints[:, _TOP_K]
            s_base[:m] = noise_base_on_host(held_ints[:, _SEED_HALF], s_step[:m])
            floats[2:, :m] = held_floats[:, _TEMPERATURE : _PENALTY + 1].T
        self.sample_rows = m
        write_slot[np.asarray(stash_rows, dtype=np.int64)] = stash_slots
        if d_rows:
            at = np.asarray(d_rows, dtype=np.int64)  # indexes eight writes: the list converted once
            text_ids[at], is_decode[at], frame_index[at] = d_text, True, d_step
            decoding = np.asarray(d_slots, dtype=np.int64)
            top_k[at], seed[at] = self._slot_ints[decoding, _CP_TOP_K], self._slot_ints[decoding, _SEED]
            floats[0, at] = self._slot_floats[decoding, _CP_TEMPERATURE]
            floats[1, at] = self._slot_floats[decoding, _CP_TOP_P]
        decode_index = staging.decode_index.numpy()
        decode_index[:] = d_rows[0] if d_rows else 0  # padding repeats the first decode row
        if d_rows:
            decode_index[: len(d_rows)] = at
        width = max(n, 1)
        copies_started = time.perf_counter()
        for block, group in ((self._ints, staging.ints), (self._bools, staging.bools), (self._floats, staging.floats)):
            block[:width].copy_(group[:width], non_blocking=True)
        self.decode_row_index.copy_(staging.decode_index, non_blocking=True)
        if staging.copied is not None:
            staging.copied.record()
        # Rows past n (graph padding) keep old values; they only ever write the scratch slot.
        self.write_slot[n : self.max_tokens].fill_(self.scratch_slot)
        self.is_decode[n : self.max_tokens].fill_(False)
        self.last_copies_s = time.perf_counter() - copies_started  # queueing the copies and fills (API calls)
        return decode_rows
