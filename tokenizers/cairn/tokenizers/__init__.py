"""cairn.tokenizers: vocabularies (SentencePiece, Hugging Face tokenizer.json, Byte, PassThrough)
in Python and TensorFlow.

Importing this package loads neither TensorFlow, JAX nor Hugging Face `tokenizers`; TensorFlow
is imported only when a `*_tf` method is first called, `tokenizers` when a
`TokenizerJsonVocabulary` is first built.
"""

from cairn.tokenizers.byte_vocabulary import ByteVocabulary
from cairn.tokenizers.passthrough_vocabulary import PassThroughVocabulary
from cairn.tokenizers.sentencepiece_vocabulary import SentencePieceVocabulary
from cairn.tokenizers.tokenizer_json_vocabulary import TokenizerJsonVocabulary
from cairn.tokenizers.train import train_sentencepiece
from cairn.tokenizers.vocabulary import PAD_ID, Vocabulary, VocabularyError

__version__ = "0.1.0"

__all__ = [
    "PAD_ID",
    "ByteVocabulary",
    "PassThroughVocabulary",
    "SentencePieceVocabulary",
    "TokenizerJsonVocabulary",
    "Vocabulary",
    "VocabularyError",
    "train_sentencepiece",
]
