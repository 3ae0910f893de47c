"""Base-model speaker encoder: log-mel front end + ECAPA-TDNN, official names (`speaker_encoder.*` of the main
checkpoint; config from the main config's `speaker_encoder_config`). `extract_xvector(wav24k)` gives the x-vector
that fills the speaker slot of a voice-clone prompt, as official `extract_speaker_embedding`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from vllm_voxserve.contract import SAMPLE_RATE
N_FFT, NUM_MELS, HOP, WIN, FMIN, FMAX = 1024, 128, 256, 1024, 0.0, 12000.0
MEL_PAD = (N_FFT - HOP) // 2  # 384 samples of reflect padding on each side


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int = 128
    enc_dim: int = 1024  # must equal the talker hidden size
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = SAMPLE_RATE

    def __post_init__(self):
        for name in ("enc_channels", "enc_kernel_sizes", "enc_dilations"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        if not len(self.enc_channels) == len(self.enc_kernel_sizes) == len(self.enc_dilations):
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations must have the same length")
        if len(self.enc_channels) < 3:
            raise ValueError("need an initial TDNN, at least one SE-Res2Net block and the aggregation layer")
        if self.enc_channels[-1] != sum(self.enc_channels[1:-1]):
            raise ValueError("enc_channels[-1] must be the sum of the SE-Res2Net channels (they are concatenated)")
        if any(c % self.enc_res2net_scale for c in self.enc_channels[1:-1]):
            raise ValueError("SE-Res2Net channels must be divisible by enc_res2net_scale")
        if self.mel_dim != NUM_MELS or self.sample_rate != SAMPLE_RATE:
            raise ValueError(f"the mel front end is fixed at {NUM_MELS} mels, {SAMPLE_RATE} Hz")

    @classmethod
    def from_dict(cls, d: dict) -> "SpeakerEncoderConfig":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above (librosa's default, htk=False)."""
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    mels = f / f_sp
    return np.where(f >= min_log_hz, min_log_hz / f_sp + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filterbank(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = NUM_MELS, fmin: float = FMIN,
                   fmax: float = FMAX) -> torch.Tensor:
    """Slaney-normalised triangular mel filters `[n_mels, n_fft//2 + 1]` (same as librosa.filters.mel defaults)."""
    fft_freqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_freqs = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    widths = np.diff(mel_freqs)
    ramps = mel_freqs[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_freqs[2:] - mel_freqs[:-2]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


def log_mel_spectrogram(wav: torch.Tensor) -> torch.Tensor:
    """wav `[B, N]` float at 24 kHz -> log-mel `[B, frames, 128]` (reflect pad 384, Hann 1024, hop 256, no center)."""
    padded = F.pad(wav.unsqueeze(1), (MEL_PAD, MEL_PAD), mode="reflect").squeeze(1)
    spec = torch.stft(padded, N_FFT, hop_length=HOP, win_length=WIN, window=torch.hann_window(WIN, device=wav.device),
                      center=False, normalized=False, onesided=True, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.matmul(mel_filterbank().to(wav.device), magnitude)
    return torch.log(torch.clamp(mel, min=1e-5)).transpose(1, 2)


def _same_conv(cin: int, cout: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TimeDelayNetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = _same_conv(cin, cout, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    """Split channels in `scale` groups; group i>0 goes through its TDNN after adding the previous group's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(TimeDelayNetBlock(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outputs = [parts[0]]
        for i in range(1, self.scale):
            outputs.append(self.blocks[i - 1](parts[i] if i == 1 else parts[i] + outputs[-1]))
        return torch.cat(outputs, dim=1)


class SqueezeExcitationBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = _same_conv(channels, se_channels, 1)
        self.conv2 = _same_conv(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SqueezeExcitationRes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TimeDelayNetBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, scale, kernel, dilation)
        self.tdnn2 = TimeDelayNetBlock(cout, cout, 1, 1)
        self.se_block = SqueezeExcitationBlock(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _weighted_stats(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = (weights * x).sum(2)
    std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
    return mean, std


class AttentiveStatisticsPooling(nn.Module):
    """Attention over time conditioned on the global mean/std, then attention-weighted mean and std per channel."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TimeDelayNetBlock(channels * 3, attention_channels, 1, 1)
        self.conv = _same_conv(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, t), 1.0 / t, dtype=x.dtype, device=x.device)
        mean, std = _weighted_stats(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)], dim=1)
        attention = F.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_stats(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN (official `Qwen3TTSSpeakerEncoder`): log-mel `[B, T, 128]` -> x-vector `[B, enc_dim]`."""

    def __init__(self, config: SpeakerEncoderConfig):
        super().__init__()
        c = config
        self.config = c
        blocks: list[nn.Module] = [TimeDelayNetBlock(c.mel_dim, c.enc_channels[0], c.enc_kernel_sizes[0],
                                                     c.enc_dilations[0])]
        for i in range(1, len(c.enc_channels) - 1):
            blocks.append(SqueezeExcitationRes2NetBlock(c.enc_channels[i - 1], c.enc_channels[i], c.enc_res2net_scale,
                                                        c.enc_se_channels, c.enc_kernel_sizes[i], c.enc_dilations[i]))
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TimeDelayNetBlock(c.enc_channels[-1], c.enc_channels[-1], c.enc_kernel_sizes[-1],
                                     c.enc_dilations[-1])
        self.asp = AttentiveStatisticsPooling(c.enc_channels[-1], c.enc_attention_channels)
        self.fc = _same_conv(c.enc_channels[-1] * 2, c.enc_dim, 1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        h = mels.transpose(1, 2)
        outputs = []
        for block in self.blocks:
            h = block(h)
            outputs.append(h)
        h = self.mfa(torch.cat(outputs[1:], dim=1))
        return self.fc(self.asp(h)).squeeze(-1)

    @torch.no_grad()
    def extract_xvector(self, wav: torch.Tensor | np.ndarray, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
        """Mono 24 kHz clip `[N]` -> x-vector `[enc_dim]` (in the module's dtype)."""
        if sample_rate != SAMPLE_RATE:
            raise ValueError(f"reference audio must be {SAMPLE_RATE} Hz (resample first), got {sample_rate}")
        wav = torch.as_tensor(wav)
        if wav.dim() != 1:
            raise ValueError(f"expected a mono clip [N], got shape {tuple(wav.shape)}")
        if wav.numel() == 0:
            raise ValueError("reference audio is empty")
        if wav.numel() <= MEL_PAD:
            raise ValueError(f"reference audio is too short: {wav.numel()} samples, need more than {MEL_PAD}")
        param = next(self.parameters())
        mels = log_mel_spectrogram(wav.float()[None].to(param.device))
        return self(mels.to(param.dtype))[0]
