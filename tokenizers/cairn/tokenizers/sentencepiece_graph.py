"""SentencePiece in plain TensorFlow ops, for a graph that must run without Python: a SavedModel
that a server loads (no `tf.numpy_function`, no tensorflow-text, no custom op).

`SentencePieceGraph(model_bytes)` reads a serialized unigram model (`SentencePieceVocabulary.sp_model`:
its sentinels included) and builds lookup tables; `encode(strings)` gives a `tf.RaggedTensor` of
int32 ids and `decode(ids)` strings, both equal to the `sentencepiece` library's on the same model
(tests/tokenizers/sentencepiece_graph_test.py compares them over Shakespeare's lines and unusual
text). What it reimplements, following SentencePiece's normalizer and unigram encoder:

- normalization: at each position the longest user-defined piece is copied as it is, else the
  longest key of the model's precompiled character map (`normalizer_spec.precompiled_charsmap`,
  a darts-clone double array, walked in the graph as SentencePiece walks it) is replaced by its
  value, else one UTF-8 character is copied (an invalid byte becomes U+FFFD); leading, trailing
  and repeated spaces are dropped (`remove_extra_whitespaces`), a space goes in front (`add_dummy_prefix`),
  and spaces become U+2581 (`escape_whitespaces`);
- segmentation: the Viterbi path over the normalized bytes as `EncodeOptimized` computes it (the
  first best candidate wins a tie; a user-defined piece scores `bytes * max_score - 0.1` in
  double precision; a character no piece covers is UNK at `min_score - 10`), and consecutive
  UNKs merged into one;
- decoding: control pieces render as nothing, UNK as " \u2047 ", U+2581 as a space, and each
  piece before the first that renders as something loses its leading U+2581.

TensorFlow is imported when a `SentencePieceGraph` is built. Supported: unigram models without byte fallback,
whitespace as a prefix, no denormalizer (T5's, mT5's and Cairn's trained models). Others raise
`VocabularyError` naming what is not supported. The loops run once per byte of each string
(`tf.while_loop`): fine for serving requests, not meant for bulk preprocessing
(`SentencePieceVocabulary.encode_tf` is faster there).
"""

from __future__ import annotations

import struct
from typing import Any

from cairn.tokenizers.vocabulary import VocabularyError

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_UNIGRAM = 1
_UNK_PENALTY = 10.0
_SPACE = "\u2581".encode()
_REPLACEMENT = "\ufffd".encode()
UNK_SURFACE = " \u2047 "


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """A protobuf message's `(field, wire type, value)` in order (varint ints, fixed32 as bytes,
    length-delimited as bytes)."""
    out: list[tuple[int, int, Any]] = []
    i = 0
    while i < len(buf):
        value: Any
        key, i = _read_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 2:
            n, i = _read_varint(buf, i)
            value, i = buf[i : i + n], i + n
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise VocabularyError(f"not a SentencePiece model (wire type {wire})")
        out.append((field, wire, value))
    return out


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise VocabularyError("not a SentencePiece model (truncated)")
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


class ModelSpec:
    """What the graph needs of a serialized `ModelProto`: pieces `(text, score, type)` and the
    trainer and normalizer fields (later occurrences of a field win, as protobuf merges)."""

    def __init__(self, model: bytes):
        self.pieces: list[tuple[bytes, float, int]] = []
        trainer: dict[int, Any] = {}
        self.normalizer: dict[int, Any] = {}
        denormalizer: dict[int, Any] = {}
        for field, _, value in _fields(model):
            if field == 1:
                piece = {f: v for f, _, v in _fields(value)}
                score = struct.unpack("<f", piece[2])[0] if 2 in piece else 0.0
                self.pieces.append((piece.get(1, b""), score, piece.get(3, _NORMAL)))
            elif field == 2:
                trainer.update((f, v) for f, _, v in _fields(value))
            elif field == 3:
                self.normalizer.update((f, v) for f, _, v in _fields(value))
            elif field == 5:
                denormalizer.update((f, v) for f, _, v in _fields(value))
        if not self.pieces:
            raise VocabularyError("not a SentencePiece model (it has no pieces)")
        if trainer.get(3, _UNIGRAM) != _UNIGRAM:
            raise VocabularyError(f"SentencePiece model_type {trainer[3]}: only unigram models export to a graph")
        if trainer.get(35, 0):
            raise VocabularyError("SentencePiece byte_fallback models do not export to a graph")
        if trainer.get(24, 0):
            raise VocabularyError("SentencePiece treat_whitespace_as_suffix models do not export to a graph")
        if denormalizer.get(2) or denormalizer.get(6):
            raise VocabularyError("SentencePiece models with a denormalizer do not export to a graph")
        self.add_dummy_prefix = bool(self.normalizer.get(3, 1))
        self.remove_extra_whitespaces = bool(self.normalizer.get(4, 1))
        self.escape_whitespaces = bool(self.normalizer.get(5, 1))
        normal = [s for _, s, t in self.pieces if t == _NORMAL]
        self.min_score, self.max_score = (min(normal), max(normal)) if normal else (0.0, 0.0)
        unk = [i for i, (_, _, t) in enumerate(self.pieces) if t == _UNKNOWN]
        if not unk:
            raise VocabularyError("SentencePiece model without an UNK piece")
        self.unk_id = unk[0]

    def charsmap(self) -> tuple[Any, bytes]:
        """The precompiled character map (uint32 trie size, darts-clone double-array units, then
        the NUL-terminated replacements): `(units as int64, replacements)`; `(None, b"")` for none."""
        import numpy as np

        blob = self.normalizer.get(2, b"")
        if not blob:
            return None, b""
        (size,) = struct.unpack("<I", blob[:4])
        return np.frombuffer(blob[4 : 4 + size], "<u4").astype(np.int64), blob[4 + size :]


class SentencePieceGraph:
    """`encode` and `decode` of one SentencePiece model in TensorFlow ops (module docstring). A
    `tf.Module` that saves functions calling them must track `tables` (its lookup tables), e.g.
    as an attribute."""

    def __init__(self, model: bytes):
        import tensorflow as tf

        spec = ModelSpec(model)
        self.spec = spec
        texts = [p for p, _, _ in spec.pieces]
        types = [t for _, _, t in spec.pieces]
        scores = [s for _, s, _ in spec.pieces]
        in_lattice = [i for i, t in enumerate(types) if t in (_NORMAL, _USER_DEFINED)]
        self.max_piece = max(len(texts[i]) for i in in_lattice)
        self._piece_ids = _table([texts[i] for i in in_lattice], in_lattice, -1)
        self._scores = tf.constant(scores, tf.float32)
        self._user_defined = tf.constant([t == _USER_DEFINED for t in types])
        user = sorted({texts[i] for i, t in enumerate(types) if t == _USER_DEFINED})
        self.max_user = max([len(u) for u in user] + [1])
        self._user = _table(user or [b"\0"], list(range(len(user))) or [0], -1) if user else None
        units, replacements = spec.charsmap()
        self._units = None if units is None else tf.constant(units, tf.int64)
        self._replacement_blob = tf.constant(replacements)
        ends = [0] * len(replacements)
        nul = len(replacements)
        for i in reversed(range(len(replacements))):
            nul = i if replacements[i] == 0 else nul
            ends[i] = nul
        self._replacement_ends = tf.constant(ends or [0], tf.int64)
        surfaces = []
        for text, t in zip(texts, types):
            surfaces.append(b"" if t in (_CONTROL, _UNUSED) else UNK_SURFACE.encode() if t == _UNKNOWN else text)
        self._surfaces = tf.constant(surfaces)
        self._strip_first = spec.add_dummy_prefix or spec.remove_extra_whitespaces
        self.vocab_size = len(texts)
        self.tables = [t for t in (self._piece_ids, self._user) if t is not None]

    # -- normalization ----------------------------------------------------------------
    def _longest_key(self, text: Any, pos: Any, n: Any) -> tuple[Any, Any]:
        """`(length, replacement offset)` of the longest key of the charsmap trie at `pos`
        (darts-clone's common prefix search); length 0 for none."""
        import tensorflow as tf

        if self._units is None:
            return tf.constant(0), tf.constant(0, tf.int64)
        units = self._units
        size = tf.shape(units, out_type=tf.int64)[0]

        def offset(unit):
            return tf.bitwise.left_shift(tf.bitwise.right_shift(unit, 10), tf.bitwise.right_shift(unit & 512, 6))

        def cond(i, node, alive, best, value):
            return tf.logical_and(alive, pos + i < n)

        def body(i, node, alive, best, value):
            byte = tf.cast(tf.io.decode_raw(tf.strings.substr(text, pos + i, 1), tf.uint8)[0], tf.int64)
            at = tf.bitwise.bitwise_xor(node, byte)
            unit = tf.gather(units, tf.clip_by_value(at, 0, size - 1))
            match = tf.logical_and(at < size, tf.equal(unit & 0x800000FF, byte))
            child = tf.bitwise.bitwise_xor(at, offset(unit))
            leaf = tf.logical_and(match, tf.equal(tf.bitwise.right_shift(unit, 8) & 1, 1))
            leaf_value = tf.gather(units, tf.clip_by_value(child, 0, size - 1)) & 0x7FFFFFFF
            best = tf.where(leaf, i + 1, best)
            value = tf.where(leaf, leaf_value, value)
            return i + 1, child, match, best, value

        start = offset(units[0])
        _, _, _, best, value = tf.while_loop(
            cond, body, [tf.constant(0), start, tf.constant(True), tf.constant(0), tf.constant(0, tf.int64)]
        )
        return best, value

    def normalize(self, text: Any) -> Any:
        """One string (scalar) normalized as SentencePiece does (module docstring)."""
        import tensorflow as tf

        spec = self.spec
        n = tf.strings.length(text)
        space = _SPACE if spec.escape_whitespaces else b" "

        def prefix(pos):
            """(replacement, bytes consumed) at `pos`."""
            rest = tf.strings.substr(text, pos, self.max_user)
            found_user = tf.constant(False)
            user_len = tf.constant(0)
            if self._user is not None:
                lens = tf.range(1, self.max_user + 1)
                hits = (
                    self._user.lookup(tf.strings.substr(tf.fill([self.max_user], rest), tf.zeros_like(lens), lens)) >= 0
                )
                hits = tf.logical_and(hits, lens <= n - pos)
                found_user = tf.reduce_any(hits)
                user_len = tf.reduce_max(tf.where(hits, lens, 0))
            key_len, value = self._longest_key(text, pos, n)
            end = tf.gather(self._replacement_ends, value)
            key_rep = tf.strings.substr(self._replacement_blob, value, end - value)
            char_len = _char_length(tf.strings.substr(text, pos, 1))
            char = tf.strings.substr(text, pos, char_len)
            valid = tf.logical_and(
                char_len <= n - pos,
                tf.equal(
                    tf.strings.unicode_transcode(char, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD),
                    char,
                ),
            )
            plain_rep = tf.where(valid, char, tf.constant(_REPLACEMENT))
            plain_len = tf.where(valid, char_len, 1)
            rep = tf.where(found_user, tf.strings.substr(rest, 0, user_len), tf.where(key_len > 0, key_rep, plain_rep))
            used = tf.where(found_user, user_len, tf.where(key_len > 0, key_len, plain_len))
            return rep, used

        pos = tf.constant(0)
        if spec.remove_extra_whitespaces:  # leading spaces (after normalization) are dropped

            def lead_cond(p):
                rep, _ = prefix(p)
                return tf.logical_and(p < n, tf.equal(rep, " "))

            pos = tf.while_loop(lead_cond, lambda p: [p + prefix(p)[1]], [pos])[0]

        def body(p, out, prev_space):
            rep, used = prefix(p)
            if spec.remove_extra_whitespaces:
                # drop the replacement's leading spaces after a space
                stripped = tf.strings.regex_replace(rep, "^ +", "")
                rep = tf.where(prev_space, stripped, rep)
            nonempty = tf.strings.length(rep) > 0
            ends_space = tf.strings.regex_full_match(rep, "(?s).* $")
            prev_space = tf.where(nonempty, ends_space, prev_space)
            if spec.escape_whitespaces:
                rep = tf.strings.regex_replace(rep, " ", space.decode())
            prev_space = tf.logical_and(prev_space, spec.remove_extra_whitespaces)
            return p + used, out + rep, prev_space

        start = tf.constant(space if spec.add_dummy_prefix else b"")
        start = tf.where(pos < n, start, tf.constant(b""))
        _, out, _ = tf.while_loop(
            lambda p, out, prev: p < n,
            body,
            [pos, start, tf.constant(spec.remove_extra_whitespaces)],
        )
        if spec.remove_extra_whitespaces:
            out = tf.strings.regex_replace(out, "(" + _escape(space.decode()) + ")+$", "")
        return out

    # -- segmentation -----------------------------------------------------------------
    def encode_one(self, text: Any) -> Any:
        """One string to its int32 ids (1-D)."""
        import tensorflow as tf

        norm = self.normalize(text)
        n = tf.strings.length(norm)
        length = self.max_piece
        lens = tf.range(1, length + 1)
        unk_score = tf.constant(self.spec.min_score - _UNK_PENALTY, tf.float32)
        max_score = tf.constant(self.spec.max_score, tf.float32)
        best = tf.zeros([n + 1], tf.float32)
        starts = tf.concat([[0], tf.fill([n], -1)], 0)
        ids = tf.fill([n + 1], -1)

        def body(s, best, starts, ids):
            reached = starts[s] >= 0
            here = best[s]
            piece_ids = tf.cast(
                self._piece_ids.lookup(tf.strings.substr(tf.fill([length], norm), tf.fill([length], s), lens)), tf.int32
            )
            ok = tf.logical_and(tf.logical_and(piece_ids >= 0, lens <= n - s), reached)
            safe = tf.maximum(piece_ids, 0)
            user = tf.gather(self._user_defined, safe)
            user_score = tf.cast(tf.cast(lens, tf.float32) * max_score, tf.float64) - 0.1
            score = tf.where(user, user_score, tf.cast(tf.gather(self._scores, safe), tf.float64))
            candidate = score + tf.cast(here, tf.float64)
            ends = tf.minimum(s + lens, n)
            old = tf.gather(best, ends)
            better = tf.logical_and(
                ok, tf.logical_or(tf.gather(starts, ends) < 0, candidate > tf.cast(old, tf.float64))
            )
            idx = tf.boolean_mask(ends, better)[:, None]
            best = tf.tensor_scatter_nd_update(best, idx, tf.cast(tf.boolean_mask(candidate, better), tf.float32))
            starts = tf.tensor_scatter_nd_update(starts, idx, tf.fill([tf.shape(idx)[0]], s))
            ids = tf.tensor_scatter_nd_update(ids, idx, tf.boolean_mask(piece_ids, better))
            char_len = _char_length(tf.strings.substr(norm, s, 1))
            single = tf.reduce_any(tf.logical_and(ok, tf.equal(lens, char_len)))
            end = tf.minimum(s + char_len, n)
            unk = here + unk_score
            take = tf.logical_and(
                tf.logical_and(reached, tf.logical_not(single)),
                tf.logical_or(starts[end] < 0, unk > best[end]),
            )
            best = tf.where(take, tf.tensor_scatter_nd_update(best, [[end]], [unk]), best)
            starts = tf.where(take, tf.tensor_scatter_nd_update(starts, [[end]], [s]), starts)
            ids = tf.where(take, tf.tensor_scatter_nd_update(ids, [[end]], [self.spec.unk_id]), ids)
            return s + 1, best, starts, ids

        _, best, starts, ids = tf.while_loop(lambda s, *_: s < n, body, [tf.constant(0), best, starts, ids])

        def back(e, out):
            return starts[e], out.write(out.size(), ids[e])

        _, path = tf.while_loop(lambda e, out: e > 0, back, [n, tf.TensorArray(tf.int32, size=0, dynamic_size=True)])
        path = tf.reverse(path.stack(), [0])
        # consecutive UNKs are one UNK
        prev_unk = tf.concat([[False], tf.equal(path[:-1], self.spec.unk_id)], 0)
        return tf.boolean_mask(path, tf.logical_not(tf.logical_and(prev_unk, tf.equal(path, self.spec.unk_id))))

    def encode(self, texts: Any) -> Any:
        """A 1-D string tensor to a `tf.RaggedTensor` of int32 ids (no EOS)."""
        import tensorflow as tf

        return tf.map_fn(
            self.encode_one,
            texts,
            fn_output_signature=tf.RaggedTensorSpec(shape=[None], dtype=tf.int32),
        )

    def decode(self, ids: Any) -> Any:
        """Dense int32 ids `[b, n]` (already cleaned: nothing after EOS, ids in range) to
        strings `[b]`."""
        import tensorflow as tf

        ids = tf.convert_to_tensor(ids, tf.int32)
        surfaces = tf.gather(self._surfaces, ids)
        if self._strip_first:
            # While nothing is written yet, a piece loses its leading U+2581.
            stripped = tf.strings.regex_replace(surfaces, "^" + _escape(_SPACE.decode()), "")
            empty = tf.cast(tf.equal(tf.strings.length(stripped), 0), tf.int32)
            first = tf.math.cumprod(empty, axis=-1, exclusive=True) > 0
            surfaces = tf.where(first, stripped, surfaces)
        text = tf.strings.reduce_join(surfaces, axis=-1)
        return tf.strings.regex_replace(text, _SPACE.decode(), " ")


def _escape(s: str) -> str:
    return "".join("\\" + c if c in r".^$*+?()[]{}|\\" else c for c in s)


def _char_length(lead: Any) -> Any:
    """The UTF-8 length of a character from its first byte (1 for a stray byte)."""
    import tensorflow as tf

    byte = tf.cast(tf.io.decode_raw(tf.strings.join([lead, b"\0"]), tf.uint8)[0], tf.int32)
    return tf.where(byte >= 0xF0, 4, tf.where(byte >= 0xE0, 3, tf.where(byte >= 0xC0, 2, 1)))


def _table(keys: list[bytes], values: list[int], default: int) -> Any:
    import tensorflow as tf

    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.constant(values, tf.int64)), default
    )
