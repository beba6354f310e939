"""The T5 family (`model.kind` "encoder_decoder"): `T5Config` and the `EncoderDecoder` network;
`t5.model` (`EncoderDecoderModel`), `t5.presets`, `t5.hf` (Hugging Face interchange) and
`t5.family` (its registration) are imported on their own."""

from cairn.models.t5.config import T5Config
from cairn.models.t5.network import Decoder, DecoderLayer, Encoder, EncoderDecoder, EncoderLayer

__all__ = ["Decoder", "DecoderLayer", "Encoder", "EncoderDecoder", "EncoderLayer", "T5Config"]
