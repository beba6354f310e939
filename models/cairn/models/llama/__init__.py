"""The Llama family (`model.kind` "llama"; Llama and Mixtral shapes): `LlamaConfig` and the `Llama`
network; `llama.presets`, `llama.hf` (Hugging Face interchange) and `llama.family` (its
registration) are imported on their own."""

from cairn.models.llama.config import LlamaConfig
from cairn.models.llama.network import Llama

__all__ = ["Llama", "LlamaConfig"]
