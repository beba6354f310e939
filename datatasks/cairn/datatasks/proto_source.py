"""`ProtoDataSource`: files of serialized protocol buffers (TFRecord by default) and the
function that decodes one record into features, as seqio's `ProtoDataSource`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.sources import TFRecordFileSource
from cairn.datatasks.tf_data import map_inline


class ProtoDataSource(TFRecordFileSource):
    """Records of serialized protos, one example each, decoded by `decode_proto_fn`.

    `decode_proto_fn(serialized: tf.Tensor) -> dict[str, tf.Tensor]` runs in the tf.data
    graph (e.g. `tf.io.decode_proto` with the message type and a descriptor set, or
    `tf.io.parse_single_example`); `reader_cls(path)` reads a file's records (when None:
    `tf.data.TFRecordDataset`, or `cairn.storage` for files at a URL). The decode function's
    source is part of a cache's fingerprint, so changing it invalidates caches built with the
    old one.
    """

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        decode_proto_fn: Callable[[tf.Tensor], Mapping[str, tf.Tensor]],
        reader_cls: Callable[..., tf.data.Dataset] | None = None,
        num_input_examples: Mapping[str, int] | None = None,
    ):
        super().__init__(split_to_filepattern, num_input_examples)
        self.decode_fn = decode_proto_fn
        self._reader = reader_cls

    def _postprocess(self, ds, stats):
        return map_inline(ds, lambda record: dict(self.decode_fn(record)))
