"""The Qwen3-TTS talker in plain PyTorch, with the official parameter names (so checkpoints load by name).

Its decoder layers are shared with the code predictor (`decoder_layers`). `TextProjection` and `embed_plan` are what
the vLLM model reuses; only the decoder layers are replaced there.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .code_predictor import CodePredictor
from .configuration import Qwen3TTSTalkerConfig
from .decoder_layers import DecoderLayer, KVCache, RMSNorm, rotary_cos_sin, sum_frame_embeddings
from .prompt import CodecKind, InputPlan


class TextProjection(nn.Module):
    """The official ResizeMLP: text embedding (text_hidden_size) -> talker hidden, token by token."""

    def __init__(self, text_hidden_size: int, hidden_size: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden_size, text_hidden_size, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden_size, hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(nn.Module):
    """`talker.model`: decoder layers, final norm, and the two input embedding tables."""

    def __init__(self, config: Qwen3TTSTalkerConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.codec_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)

    def forward(self, inputs_embeds: torch.Tensor, kv: KVCache | None = None) -> torch.Tensor:
        """inputs_embeds [B,T,H] continuing the cache (unpadded rows) -> final-norm hidden states [B,T,H]."""
        start = kv.length(0) if kv is not None else 0
        positions = torch.arange(start, start + inputs_embeds.shape[1], device=inputs_embeds.device)[None]
        cos, sin = rotary_cos_sin(positions, self.config.head_dim, self.config.rope_theta, inputs_embeds.dtype)
        x = inputs_embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv, i)
        return self.norm(x)


class Talker(nn.Module):
    """`talker`: model, text_projection, codec_head and code_predictor."""

    def __init__(self, config: Qwen3TTSTalkerConfig):
        super().__init__()
        self.config = config
        self.model = TalkerModel(config)
        self.text_projection = TextProjection(config.text_hidden_size, config.hidden_size)
        self.codec_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.code_predictor_config, config.hidden_size)
        self.code_predictor.bind_codec_embedding(self.model.codec_embedding)

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """P(id) for text-stream ids [...] -> [..., H]."""
        return self.text_projection(self.model.text_embedding(ids))

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B,16] of one frame -> [B,H], the codec term of the next talker input."""
        return sum_frame_embeddings(self.model.codec_embedding, self.code_predictor.model.codec_embedding, codes)


def embed_plan(plan: InputPlan, text_projection: TextProjection, text_embedding: nn.Embedding,
               codec_embedding: nn.Embedding, residual_embeddings: Sequence[nn.Embedding],
               x_vector: torch.Tensor | None = None, ref_codes: torch.Tensor | None = None):
    """A plan -> (prefill embeddings [L,H], trailing text embeddings [N,H]) as the official `generate` builds them.

    x_vector [H]: the Base speaker embedding; ref_codes [F,16]: the ICL reference frames (codec encoder output).
    Text terms go through `text_projection` in one call per stream, codec terms are looked up per slot. The plan's
    ids and rows reach the device in one copy that does not wait for the device: served, this runs while the
    previous engine step is on the GPU, and a blocking copy (`torch.tensor(..., device=)`, a list as an index) would
    wait for that step to end."""
    device = codec_embedding.weight.device
    kinds = [slot.kind for slot in plan.codec]
    token_rows = [i for i, k in enumerate(kinds) if k == CodecKind.TOKEN]
    speaker_rows = [i for i, k in enumerate(kinds) if k == CodecKind.SPEAKER]
    frame_rows = [i for i, k in enumerate(kinds) if k == CodecKind.REF_FRAME]
    text_ids = [*plan.text_ids, *plan.trailing_text_ids]
    token_ids = [plan.codec[i].value for i in token_rows]
    frames = [plan.codec[i].value for i in frame_rows]
    if frames and (ref_codes is None or ref_codes.shape[0] <= max(frames)):
        raise ValueError(f"this plan needs {max(frames) + 1} reference frames [F,16]")
    staged = _to_device(text_ids + token_rows + token_ids + speaker_rows + frame_rows + frames, device)
    parts = staged.split([len(text_ids), len(token_rows), len(token_ids), len(speaker_rows), len(frame_rows),
                          len(frames)])
    text = text_projection(text_embedding(parts[0]))
    prefill_text, trailing = text[:len(plan)], text[len(plan):]
    codec = torch.zeros_like(prefill_text)
    if token_rows:
        codec.index_copy_(0, parts[1], codec_embedding(parts[2]))
    if speaker_rows:
        if x_vector is None:
            raise ValueError("this plan has a speaker slot: pass the x-vector [H]")
        speaker = x_vector.to(device=device, dtype=codec.dtype).reshape(1, -1).expand(len(speaker_rows), -1)
        codec.index_copy_(0, parts[3], speaker)
    if frame_rows:
        codes = ref_codes.to(device).index_select(0, parts[5])  # served, the codes are already on the device
        codec.index_copy_(0, parts[4], sum_frame_embeddings(codec_embedding, residual_embeddings, codes)
                          .to(codec.dtype))
    return prefill_text + codec, trailing


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """int64 [len(values)] on `device`; on CUDA through pinned memory, queued behind the stream's work, not waited on."""
    host = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def embed_plan_with(talker: Talker, plan: InputPlan, x_vector=None, ref_codes=None):
    """`embed_plan` with the modules of a `Talker`."""
    return embed_plan(plan, talker.text_projection, talker.model.text_embedding, talker.model.codec_embedding,
                      talker.code_predictor.model.codec_embedding, x_vector, ref_codes)
