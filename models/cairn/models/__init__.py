"""cairn.models: T5-family encoder-decoders, GPT-style and Llama decoders (dense or mixture of experts), losses,
decoding, checkpoint interchange.

Imports only JAX, Flax and NumPy (safetensors lazily, for Hugging Face interchange).
"""

__version__ = "0.1.0"

from cairn.models import decoder_only, decoding, families, llama, losses, moe, t5
from cairn.models.decoder_only import DecoderOnlyConfig
from cairn.models.decoder_only_model import DecoderOnlyModel
from cairn.models.encoder_decoder_model import EncoderDecoderModel
from cairn.models.families import ModelFamily, UnknownFamilyError, family_of, get_family
from cairn.models.flops import flops_per_token, training_flops_per_step
from cairn.models.hf_interchange import HFInterchangeError, export_hf, import_hf
from cairn.models.llama import Llama, LlamaConfig
from cairn.models.model_base import DecodeOptions
from cairn.models.moe_config import MoeConfig
from cairn.models.moe_upcycle import UpcycleError, upcycle
from cairn.models.params import count_params, logical_axes
from cairn.models.presets import PRESETS, get_preset
from cairn.models.t5.config import T5Config
from cairn.models.transformer_config import ModelConfig, TransformerConfig

__all__ = [
    "DecodeOptions",
    "DecoderOnlyConfig",
    "DecoderOnlyModel",
    "EncoderDecoderModel",
    "HFInterchangeError",
    "Llama",
    "LlamaConfig",
    "ModelConfig",
    "ModelFamily",
    "MoeConfig",
    "PRESETS",
    "T5Config",
    "TransformerConfig",
    "UnknownFamilyError",
    "UpcycleError",
    "count_params",
    "decoder_only",
    "decoding",
    "export_hf",
    "families",
    "family_of",
    "flops_per_token",
    "get_family",
    "get_preset",
    "import_hf",
    "llama",
    "logical_axes",
    "losses",
    "moe",
    "t5",
    "training_flops_per_step",
    "upcycle",
]
