"""The Qwen3-TTS 12 Hz speech tokenizer: decoder with exact incremental decode in shared state slots, encoder for
reference clips, speaker encoder, random checkpoint maker."""
from .checkpoint import (
    load_codec_decoder,
    load_codec_encoder,
    load_speaker_encoder,
    make_random_speech_tokenizer,
    random_speaker_encoder_weights,
)
from .configuration import CodecDecoderConfig, SpeechTokenizerConfig
from .decoder import CodecDecoder
from .encoder import CodecEncoder
from .init import init_speaker_encoder_weights
from .speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig, log_mel_spectrogram
from .state import CodecStatePool, codec_state_shapes, decode_chunk

__all__ = [
    "CodecDecoder", "CodecDecoderConfig", "CodecEncoder", "CodecStatePool", "SpeakerEncoder", "SpeakerEncoderConfig",
    "SpeechTokenizerConfig", "codec_state_shapes", "decode_chunk", "init_speaker_encoder_weights",
    "load_codec_decoder", "load_codec_encoder", "load_speaker_encoder", "log_mel_spectrogram",
    "make_random_speech_tokenizer", "random_speaker_encoder_weights",
]
