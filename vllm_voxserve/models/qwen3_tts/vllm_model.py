"""Qwen3-TTS as a vLLM model: the talker on vLLM's layers (paged KV cache, continuous batching, CUDA graphs), the
code predictor inside the step, and the codec program that turns finished frames into audio.

Parameter names follow the official checkpoint (`talker.model.layers.N.self_attn.q_proj` ...); vLLM's fused
`qkv_proj` / `gate_up_proj` are filled shard by shard. The embeddings, text projection and code predictor are our
reference modules, reused as they are.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import torch
from torch import nn

from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.qwen3 import Qwen3DecoderLayer

from vllm_voxserve.config import process_config
from vllm_voxserve.models.step_layout import StepLayout

from .code_predictor import CodePredictor
from .codebook0 import Codebook0Draw
from .fused_code_predictor import FusedCodePredictor
from .configuration import Qwen3TTSConfig
from .job import SpeechJob
from .model_files import resolve_model_dir
from .prompt import PromptTables, TalkerGenerationRules, build_plan
from .served_code_predictor import ServedCodePredictor
from .step_buffers import DecodeRow, RowCheck, ServedRequest, StepBuffers
from .talker import TextProjection, embed_plan
from .text_track import TextTrack

# official name piece -> (vLLM fused parameter, shard id)
_STACKED = (("q_proj", "qkv_proj", "q"), ("k_proj", "qkv_proj", "k"), ("v_proj", "qkv_proj", "v"),
            ("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1))


@support_torch_compile(dynamic_arg_dims={"positions": -1, "inputs_embeds": 0})
class TalkerBackbone(nn.Module):
    """`talker.model`: vLLM decoder layers + final norm (compiled), and the two input embedding tables."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config.talker_config
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(config, vllm_config.cache_config, vllm_config.quant_config, prefix=f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.codec_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)

    def forward(self, positions: torch.Tensor, inputs_embeds: torch.Tensor) -> torch.Tensor:
        hidden, residual = inputs_embeds, None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Talker(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        config = vllm_config.model_config.hf_config.talker_config
        self.model = TalkerBackbone(vllm_config=vllm_config, prefix=f"{prefix}.model")
        self.text_projection = TextProjection(config.text_hidden_size, config.hidden_size)
        self.codec_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.code_predictor_config, config.hidden_size)
        self.code_predictor.bind_codec_embedding(self.model.codec_embedding)


class Qwen3TTSForVllm(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config: Qwen3TTSConfig = vllm_config.model_config.hf_config
        self.config = config
        model_config = vllm_config.model_config
        # a hub repo id is resolved through the hub cache: the speech tokenizer is read from this folder
        self.model_path = resolve_model_dir(model_config.model, model_config.revision,
                                            vllm_config.load_config.download_dir)
        self.voxserve = process_config(vllm_config.additional_config)
        self.talker = Talker(vllm_config, prefix="talker")
        self.tables = PromptTables.from_config(config)
        rules = TalkerGenerationRules.from_tables(self.tables)
        self.rules = rules
        self.last_draw_s: float | None = None  # host seconds of the last `compute_logits` of a step
        # an id the talker never emits: decode rows' marks of generated ids go there for padding rows
        self.inert_id = min(rules.suppressed_ids)
        suppressed = torch.zeros(config.talker_config.vocab_size, dtype=torch.bool)
        suppressed[list(rules.suppressed_ids)] = True
        self.register_buffer("suppressed", suppressed, persistent=False)
        sched = vllm_config.scheduler_config
        self._buffer_shape = (sched.max_num_batched_tokens, sched.max_num_seqs)
        self.buffers: StepBuffers | None = None  # made on first use, on the model's device and dtype
        self.requests: dict[str, ServedRequest] = {}
        self._free_slots: list[int] = []
        self._decode_rows: list[DecodeRow] = []
        self.served_cp: ServedCodePredictor | None = None  # made at the first forward
        self.codebook0: Codebook0Draw | None = None  # made with the step buffers, on the model's device
        self._step_sample_rows: int | None = None  # sample rows of the filled step whose logits are not yet read

    # ---- request lifecycle (called by the runner adapters) -------------------------------------------------
    def _step_buffers(self) -> StepBuffers:
        if self.buffers is None:
            weight = self.talker.codec_head.weight
            max_tokens, max_seqs = self._buffer_shape
            self.buffers = StepBuffers(max(max_tokens, max_seqs), max_seqs, weight.shape[1], weight.dtype,
                                       weight.device, vocab_size=weight.shape[0])
            self._free_slots = list(range(max_seqs - 1, -1, -1))
            self.codebook0 = Codebook0Draw(self.rules, self.suppressed)
        return self.buffers

    @torch.inference_mode()
    def add_request(self, req_id: str, prompt_len: int, job: SpeechJob, x_vector: torch.Tensor | None = None,
                    ref_codes: torch.Tensor | None = None, text_track: TextTrack | None = None) -> ServedRequest:
        """`text_track`: where a text-stream job's text arrives (`job.text_stream`; its prompt's ids are merged in)."""
        self._step_buffers()
        plan = build_plan(self.tables, job.prompt)
        if len(plan) != prompt_len:
            raise ValueError(f"{req_id}: prompt has {prompt_len} placeholder ids but its plan has {len(plan)} rows")
        talker = self.talker
        prefill, _ = embed_plan(plan, talker.text_projection, talker.model.text_embedding,
                                talker.model.codec_embedding, talker.code_predictor.model.codec_embedding,
                                x_vector=x_vector, ref_codes=ref_codes)
        cp = job.code_predictor
        seed = job.seed if job.seed is not None else int.from_bytes(os.urandom(4), "little")
        # the slot is taken only once the request is whole (ServedRequest checks its values)
        req = ServedRequest(req_id, -1, prompt_len, prefill, plan.trailing_text_ids,
                            plan.tts_pad_id, job.fixed_length, cp.temperature, cp.top_k, cp.top_p, seed,
                            talker_sampling=(job.talker.temperature, job.talker.top_k, job.talker.top_p,
                                             job.talker.repetition_penalty))
        if job.text_stream:
            if text_track is None:
                raise ValueError(f"{req_id}: a text-stream job needs the track its text arrives on")
            text_track.merge(0, job.prompt.text_ids)
            req.text_track = text_track
        req.slot = self._free_slots.pop()
        self.buffers.seen[req.slot] = False  # its repetition penalty starts from no generated ids
        self.requests[req_id] = req
        return req

    def add_placeholder_request(self, req_id: str, prompt_len: int) -> ServedRequest:
        """A request that failed before it started still occupies rows until vLLM finishes it: feed it zeros."""
        buffers = self._step_buffers()
        zeros = torch.zeros(prompt_len, buffers.prefill_embeds.shape[1], dtype=buffers.prefill_embeds.dtype,
                            device=buffers.prefill_embeds.device)
        req = ServedRequest(req_id, self._free_slots.pop(), prompt_len, zeros, (), self.tables.tts_pad, True,
                            0.0, 0, 1.0, 0)
        self.requests[req_id] = req
        return req

    def remove_request(self, req_id: str) -> ServedRequest | None:
        req = self.requests.pop(req_id, None)
        if req is not None:
            self._free_slots.append(req.slot)
        return req

    def prepare_step(self, layout: StepLayout, row_check: RowCheck | None = None) -> None:
        self._decode_rows = []  # nothing of a step whose set-up failed may reach take_frames
        self._step_sample_rows = None
        buffers = self._step_buffers()
        self._decode_rows = buffers.fill(layout, self.requests, self._replay_embed, row_check)
        self._step_sample_rows = buffers.sample_rows

    @torch.inference_mode()
    def _replay_embed(self, req: ServedRequest, k: int) -> torch.Tensor:
        """The input [H] of a request's generated position k, as its decode row built it (preempted requests)."""
        talker = self.talker
        text = torch.tensor([req.decode_text_id(k)], device=self.buffers.text_ids.device)
        step_frames, row = req.frames[k]
        return (talker.code_predictor.frame_embedding(step_frames[row : row + 1])
                + talker.text_projection(talker.model.text_embedding(text)))[0]

    def resume_request(self, req_id: str) -> None:
        """vLLM re-adds a preempted request (Model Runner V2): it is recomputed from its first token."""
        self.requests[req_id].resuming = True

    def take_frames(self) -> tuple[torch.Tensor | None, list[DecodeRow]]:
        """Frames completed by the last forward: codes [n, 16] (device), one row per decode row, and which
        request/frame each row is. Each request also keeps where its frames are (this step's tensor and row), to
        recompute itself after a preemption."""
        rows, self._decode_rows = self._decode_rows, []
        if not rows:
            return None, rows
        # the step's decode rows lead `decode_row_index`, in the order of `rows`
        frames = self.buffers.frame_codes.index_select(0, self.buffers.decode_row_index[: len(rows)])
        for i, row in enumerate(rows):
            req = self.requests.get(row.req_id)
            if req is not None and row.frame_index == len(req.frames):
                req.frames.append((frames, i))
        return frames, rows

    # Model Runner V2's per-step state adapter (`worker.mrv2_state.SpeechModelState`). The worker that serves this
    # model sets it before loading it: the model imports nothing of the worker.
    model_state_cls: type | None = None

    @classmethod
    def get_model_state_cls(cls):
        """Model Runner V2 hook: our per-step state adapter (GPU)."""
        if cls.model_state_cls is None:
            raise RuntimeError("no speech model state: serve this model with the voxserve GPU worker")
        return cls.model_state_cls

    # ---- vLLM model interface -------------------------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.talker.model.codec_embedding(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        buf = self._step_buffers()
        n = input_ids.shape[0]
        talker = self.talker
        # Decode rows: the code predictor completes the frame whose codebook 0 vLLM sampled last step (its input
        # id here). It runs on decode rows only, at most one per request (`ServedCodePredictor`), never on prefill.
        k = self._code_predictor().run(input_ids, len(self._decode_rows))
        rows = buf.decode_row_index[:k].clamp(max=n - 1)
        codes = torch.cat([buf.cp_c0[:k, None], buf.cp_codes[:k]], dim=1)
        buf.frame_codes[:n].index_copy_(0, rows, codes)  # padding repeats a real row: equal values, no race
        # codebook 0 of each decode row's frame joins its request's generated ids (the repetition penalty's set)
        generated = torch.where(buf.is_decode.index_select(0, rows), buf.cp_c0[:k], self.inert_id)
        buf.seen.index_put_((buf.read_slot.index_select(0, rows), generated),
                            torch.ones_like(generated, dtype=torch.bool))
        text = talker.text_projection(talker.model.text_embedding(buf.text_ids.index_select(0, rows)))
        frame = talker.code_predictor.frame_embedding(codes) + text
        decode_embeds = torch.zeros_like(buf.prefill_embeds[:n]).index_copy_(0, rows, frame)
        embeds = torch.where(buf.is_decode[:n, None], decode_embeds, buf.prefill_embeds[:n])
        hidden = talker.model(positions, embeds)
        buf.stash.index_copy_(0, buf.write_slot[:n], hidden)
        # Codebook 0 of the rows vLLM samples next (`codebook0`): in a graph for n tokens, every row a step of n
        # tokens can sample (at most one per request); run eagerly, the filled step's.
        sample_rows = self._step_sample_rows
        if sample_rows is None or (hidden.is_cuda and torch.cuda.is_current_stream_capturing()):
            sample_rows = min(n, buf.max_decode_rows)
        at = buf.sample_row[:sample_rows].clamp(max=n - 1)  # dummy runs may find stale indices
        drawn = self.codebook0(talker.codec_head(hidden.index_select(0, at)).float(), buf)
        buf.codebook0_logits[:sample_rows].fill_(float("-inf")).scatter_(1, drawn[:, None], 0.0)
        return hidden

    def _code_predictor(self) -> ServedCodePredictor:
        if self.served_cp is None:  # after load_weights: the fused copies are made from the loaded weights
            self.served_cp = ServedCodePredictor(
                FusedCodePredictor(self.talker.code_predictor, self.voxserve.code_predictor_kernels),
                self._step_buffers(),
                self.talker.codec_head.out_features, self.voxserve.code_predictor_compile,
                self.voxserve.code_predictor_graphs)
        return self.served_cp

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The forward drew codebook 0 of the step's sample rows (`codebook0`): vLLM gets each drawn id as the
        only finite logit, which any of its samplers keeps. vLLM's dummy runs, which fill no step, get the codec
        head's logits with the suppressed ids masked. `last_draw_s`: this call's host seconds (the worker's step
        log shows them as `codebook0 draw us`)."""
        started = time.perf_counter()
        rows, expected = hidden_states.shape[0], self._step_sample_rows
        self._step_sample_rows = None
        if expected is None:
            return self.talker.codec_head(hidden_states).float().masked_fill(self.suppressed, float("-inf"))
        if rows != expected:
            raise RuntimeError(f"vLLM samples {rows} rows of a step whose layout has {expected} requests")
        out = self.buffers.codebook0_logits[:rows]
        self.last_draw_s = time.perf_counter() - started
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if not name.startswith("talker."):
                continue  # speaker_encoder.* is loaded with the encoders (Base)
            target, shard = name, None
            if ".layers." in name and ".code_predictor." not in name:
                for piece, fused, shard_id in _STACKED:
                    if f".{piece}." in name:
                        target, shard = name.replace(f".{piece}.", f".{fused}."), shard_id
                        break
            param = params.get(target)
            if param is None:
                raise ValueError(f"checkpoint tensor {name} has no place in {type(self).__name__}")
            loader = getattr(param, "weight_loader", default_weight_loader)
            if shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
            loaded.add(target)
        return loaded
