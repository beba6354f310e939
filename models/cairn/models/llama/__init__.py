"""The Llama family: `LlamaConfig`, the `Llama` network, RoPE, and its presets."""

from cairn.models.llama.config import LlamaConfig
from cairn.models.llama.network import Llama

__all__ = ["Llama", "LlamaConfig"]
