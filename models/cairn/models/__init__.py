"""cairn.models: T5-family encoder-decoders, GPT-style and Llama decoders (dense or mixture of experts), losses,
decoding, checkpoint interchange.

Imports only JAX, Flax and NumPy (safetensors lazily, for Hugging Face interchange).

The package imports its modules lazily (PEP 562): `from cairn.models import T5Config` or
`cairn.models.moe` loads only what that name needs, so a program (or a Bazel target: `//models:t5`,
`//models:moe`, ... in models/BUILD) that uses the T5 network never loads the routed MLP. Every
name of `__all__` is available as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module (below cairn.models) that defines it; the submodules of `__all__`
# are imported as themselves.
_SUBMODULES = frozenset(
    "chunked_loss decoding families gpt gpu_attention llama lora losses moe pallas_attention prompt_tuning t5".split()
)
_DEFINED_IN = {
    "DecodeOptions": "model_base",
    "DecoderOnlyConfig": "gpt.config",
    "DecoderOnlyModel": "decoder_only_model",
    "EncoderDecoderModel": "t5.model",
    "HFInterchangeError": "hf_files",
    "Llama": "llama",
    "LlamaConfig": "llama",
    "LoraConfig": "lora",
    "LoraModel": "lora",
    "ModelConfig": "transformer_config",
    "ModelFamily": "families",
    "MoeConfig": "moe_config",
    "PRESETS": "families",
    "PromptTuningConfig": "prompt_tuning",
    "PromptTuningModel": "prompt_tuning",
    "T5Config": "t5.config",
    "TransformerConfig": "transformer_config",
    "UnknownFamilyError": "families",
    "UpcycleError": "moe_upcycle",
    "count_params": "params",
    "export_hf": "t5.hf",
    "family_of": "families",
    "flops_per_token": "flops",
    "get_family": "families",
    "get_preset": "families",
    "import_hf": "t5.hf",
    "logical_axes": "params",
    "register_family": "families",
    "training_flops_per_step": "flops",
    "upcycle": "moe_upcycle",
}

if TYPE_CHECKING:  # what type checkers and IDEs see; nothing is imported at run time
    from cairn.models import (
        chunked_loss,
        decoding,
        families,
        gpt,
        gpu_attention,
        llama,
        lora,
        losses,
        moe,
        pallas_attention,
        prompt_tuning,
        t5,
    )
    from cairn.models.decoder_only_model import DecoderOnlyModel
    from cairn.models.families import (
        PRESETS,
        ModelFamily,
        UnknownFamilyError,
        family_of,
        get_family,
        get_preset,
        register_family,
    )
    from cairn.models.flops import flops_per_token, training_flops_per_step
    from cairn.models.gpt.config import DecoderOnlyConfig
    from cairn.models.hf_files import HFInterchangeError
    from cairn.models.llama import Llama, LlamaConfig
    from cairn.models.lora import LoraConfig, LoraModel
    from cairn.models.model_base import DecodeOptions
    from cairn.models.moe_config import MoeConfig
    from cairn.models.moe_upcycle import UpcycleError, upcycle
    from cairn.models.params import count_params, logical_axes
    from cairn.models.prompt_tuning import PromptTuningConfig, PromptTuningModel
    from cairn.models.t5.config import T5Config
    from cairn.models.t5.hf import export_hf, import_hf
    from cairn.models.t5.model import EncoderDecoderModel
    from cairn.models.transformer_config import ModelConfig, TransformerConfig

__all__ = [
    "DecodeOptions",
    "DecoderOnlyConfig",
    "DecoderOnlyModel",
    "EncoderDecoderModel",
    "HFInterchangeError",
    "Llama",
    "LlamaConfig",
    "LoraConfig",
    "LoraModel",
    "ModelConfig",
    "ModelFamily",
    "MoeConfig",
    "PRESETS",
    "PromptTuningConfig",
    "PromptTuningModel",
    "T5Config",
    "TransformerConfig",
    "UnknownFamilyError",
    "UpcycleError",
    "chunked_loss",
    "count_params",
    "decoding",
    "export_hf",
    "families",
    "family_of",
    "flops_per_token",
    "get_family",
    "get_preset",
    "gpt",
    "gpu_attention",
    "import_hf",
    "llama",
    "logical_axes",
    "lora",
    "losses",
    "moe",
    "pallas_attention",
    "prompt_tuning",
    "register_family",
    "t5",
    "training_flops_per_step",
    "upcycle",
]


def __getattr__(name: str) -> Any:
    """Imports the module behind a public name on first use and caches the value here."""
    if name in _SUBMODULES:
        value: Any = importlib.import_module(f"{__name__}.{name}")
    elif name in _DEFINED_IN:
        value = getattr(importlib.import_module(f"{__name__}.{_DEFINED_IN[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
