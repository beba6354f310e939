"""The T5 family: `T5Config` and the `EncoderDecoder` network."""

from cairn.models.t5.config import T5Config
from cairn.models.t5.network import Decoder, DecoderLayer, Encoder, EncoderDecoder, EncoderLayer

__all__ = ["Decoder", "DecoderLayer", "Encoder", "EncoderDecoder", "EncoderLayer", "T5Config"]
