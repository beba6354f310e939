"""cairn.tokenizers: vocabularies (SentencePiece, Byte, PassThrough) in Python and TensorFlow.

Importing this package loads neither TensorFlow nor JAX; TensorFlow is imported only
when a `*_tf` method is first called.
"""

from cairn.tokenizers.byte_vocabulary import ByteVocabulary
from cairn.tokenizers.passthrough_vocabulary import PassThroughVocabulary
from cairn.tokenizers.sentencepiece_vocabulary import SentencePieceVocabulary
from cairn.tokenizers.train import train_sentencepiece
from cairn.tokenizers.vocabulary import PAD_ID, Vocabulary, VocabularyError

__version__ = "0.1.0"

__all__ = [
    "PAD_ID",
    "ByteVocabulary",
    "PassThroughVocabulary",
    "SentencePieceVocabulary",
    "Vocabulary",
    "VocabularyError",
    "train_sentencepiece",
]
