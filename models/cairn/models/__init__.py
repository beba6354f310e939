"""cairn.models: The model zoo: T5-family encoder-decoders and GPT-style decoders, losses, decoding, checkpoint interchange."""

__version__ = "0.1.0"
