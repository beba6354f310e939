"""SentencePiece in plain TensorFlow ops, for a graph that must run without Python: a SavedModel
that a server loads (no `tf.numpy_function`, no tensorflow-text, no custom op).

`SentencePieceGraph(model_bytes)` reads a serialized unigram model (`SentencePieceVocabulary.sp_model`:
its sentinels included) and builds lookup tables; `encode(strings)` gives a `tf.RaggedTensor` of
int32 ids and `decode(ids)` strings, both equal to the `sentencepiece` library's on the same model
(tests/tokenizers/sentencepiece_graph_test.py compares them over 12,000 lines: Shakespeare's and
unusual Unicode). What it reimplements, following SentencePiece's normalizer and unigram encoder:

- normalization: at each position the longest user-defined piece is copied as it is, else the
  longest key of the model's precompiled character map (`normalizer_spec.precompiled_charsmap`,
  a darts-clone double array, walked in the graph as SentencePiece walks it) is replaced by its
  value, else one UTF-8 character is copied (an invalid byte, and U+FFFD itself, becomes U+FFFD
  for one byte); leading, trailing and repeated spaces are dropped (`remove_extra_whitespaces`),
  a space goes in front (`add_dummy_prefix`), and spaces become U+2581 (`escape_whitespaces`);
- segmentation: the Viterbi path over the normalized bytes as `EncodeOptimized` (sentencepiece
  0.2.3) computes it: scores add in float32, the first best candidate wins a tie, a
  user-defined piece of L bytes scores `0.1 * (L - 1)`, a character no piece covers is UNK at
  `min_score - 10`, and where a best path's score passes +-100,000 (about 40,000 characters of
  English) the scores are rebased to 0, as `EncodeOptimized` does; consecutive UNKs merged;
- decoding: control pieces render as nothing, UNK as " \u2047 ", U+2581 as a space, and each
  piece before the first that renders as something loses its leading U+2581.

How, without a loop per byte (issue 57): the normalizer's choice is computed at every byte of
every string at once (the trie walked for all positions together, as deep as the longest match),
and the positions SentencePiece visits (0, then each step's end) are the chain from 0, found by
pointer doubling in log2(length) rounds. The Viterbi runs over words: no piece has U+2581 past
its first byte (else a string is one word), so no piece crosses a word start; a character that
no candidate piece spans into starts a word too (every path passes there: unknown characters,
most punctuation). Each word's best path is found on its own, all words of all strings stepped
together one character a step (a loop as long as the longest word). A word starts from the
best path's score before it; the first pass starts every word at 0, the path found gives the
words' starting scores (added up as SentencePiece adds them, rebases included), and the pass is
repeated until they stop changing (usually once), so that scores round as SentencePiece's do.
The backtracking is pointer doubling again.

TensorFlow is imported when a `SentencePieceGraph` is built. Supported: unigram models without
byte fallback, whitespace as a prefix, no denormalizer (T5's, mT5's and Cairn's trained models).
Others raise `VocabularyError` naming what is not supported.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from cairn.tokenizers.vocabulary import VocabularyError

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_UNIGRAM = 1
_UNK_PENALTY = 10.0
_SPACE = "\u2581".encode()
_REPLACEMENT = "\ufffd".encode()
UNK_SURFACE = " \u2047 "
_FLT_MAX = 3.4028234663852886e38
_RESET = 100000.0  # EncodeOptimized rebases its scores to 0 past +-this (kScoreResetThreshold)


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
        self.min_score = min([_FLT_MAX, *(s for _, s, t in self.pieces if t == _NORMAL)])
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
        import numpy as np
        import tensorflow as tf

        spec = ModelSpec(model)
        self.spec = spec
        texts = [p for p, _, _ in spec.pieces]
        types = [t for _, _, t in spec.pieces]
        scores = np.array([s for _, s, _ in spec.pieces], np.float32)
        in_lattice = [i for i, t in enumerate(types) if t in (_NORMAL, _USER_DEFINED)]
        self.max_piece = max(len(texts[i]) for i in in_lattice)
        # Pieces never cross a word start (U+2581) unless one has U+2581 past its first byte.
        self.split_words = not any(_SPACE in texts[i][1:] for i in in_lattice)
        self._width = max(self.max_piece, 4)  # candidate lengths 1..width (4: an UNK character)
        self._piece_ids = _table([texts[i] for i in in_lattice], in_lattice, -1)
        self._scores = tf.constant(scores)
        self._user_defined = tf.constant([t == _USER_DEFINED for t in types])
        # a user-defined piece of L bytes scores 0.1 * (L - 1), as a float
        self._user_scores = tf.constant([np.float32(0.1 * n) for n in range(self._width)], tf.float32)
        self._unk_score = float(np.float32(spec.min_score) - np.float32(_UNK_PENALTY))
        user = sorted({texts[i] for i, t in enumerate(types) if t == _USER_DEFINED})
        self.max_user = max([len(u) for u in user] + [1])
        self._user = _table(user, list(range(len(user))), -1) if user else None
        self._user_first = tf.constant([any(u[0] == b for u in user) for b in range(256)])
        units, replacements = spec.charsmap()
        self._units = None if units is None else tf.constant(units, tf.int64)
        ends = [0] * len(replacements)
        nul = len(replacements)
        for i in reversed(range(len(replacements))):
            nul = i if replacements[i] == 0 else nul
            ends[i] = nul
        self._replacement_ends = tf.constant(ends or [0], tf.int32)
        self._replacements = tf.constant(list(replacements) + list(_REPLACEMENT), tf.int32)
        self._byte_strings = tf.constant([bytes([b]) for b in range(256)])
        surfaces = []
        for text, t in zip(texts, types):
            surfaces.append(b"" if t in (_CONTROL, _UNUSED) else UNK_SURFACE.encode() if t == _UNKNOWN else text)
        self._surfaces = tf.constant(surfaces)
        self._strip_first = spec.add_dummy_prefix or spec.remove_extra_whitespaces
        self.vocab_size = len(texts)
        self.tables = [t for t in (self._piece_ids, self._user) if t is not None]

    # -- normalization ----------------------------------------------------------------
    def _prefixes(self, x: Any, joined: Any, pos: Any, avail: Any) -> tuple[Any, Any, Any]:
        """At every position at once, what `NormalizePrefix` takes there: `(source, length,
        used)`, the replacement as a range of `x + replacement blob + U+FFFD` and the bytes
        consumed. `avail`: bytes left in the position's row."""
        import tensorflow as tf

        t = tf.size(x)

        def at(k):
            return tf.where(k < avail, tf.gather(x, tf.minimum(pos + k, t - 1)), -1)

        # one character (SentencePiece's DecodeUTF8: 0 for an invalid one, and U+FFFD is one)
        b0, b1, b2, b3 = at(0), at(1), at(2), at(3)

        def trail(b):
            return (b >= 0) & ((b & 0xC0) == 0x80)

        def codepoint_ok(c):
            return (c < 0xD800) | ((c >= 0xE000) & (c <= 0x10FFFF))

        cp2 = (b0 & 0x1F) * 64 + (b1 & 0x3F)
        cp3 = (b0 & 0x0F) * 4096 + (b1 & 0x3F) * 64 + (b2 & 0x3F)
        cp4 = (b0 & 0x07) * 262144 + (b1 & 0x3F) * 4096 + (b2 & 0x3F) * 64 + (b3 & 0x3F)
        two = ((b0 & 0xE0) == 0xC0) & trail(b1) & (cp2 >= 0x80)
        three = ((b0 & 0xF0) == 0xE0) & trail(b1) & trail(b2) & (cp3 >= 0x800) & codepoint_ok(cp3)
        three &= cp3 != 0xFFFD
        four = ((b0 & 0xF8) == 0xF0) & trail(b1) & trail(b2) & trail(b3) & (cp4 >= 0x10000) & codepoint_ok(cp4)
        clen = tf.where(b0 < 0x80, 1, tf.where(two, 2, tf.where(three, 3, tf.where(four, 4, 0))))
        key_len, key_value = self._longest_keys(x, pos, avail)
        user_len = self._user_matches(x, joined, pos, avail)
        user = user_len > 0
        key = ~user & (key_len > 0)
        used = tf.where(user, user_len, tf.where(key, key_len, tf.maximum(clen, 1)))
        blob_end = tf.gather(self._replacement_ends, key_value)
        fffd = tf.size(self._replacements) - 3
        source = tf.where(user | (~key & (clen > 0)), pos, tf.where(key, t + key_value, t + fffd))
        length = tf.where(user, user_len, tf.where(key, blob_end - key_value, tf.where(clen > 0, clen, 3)))
        return source, length, used

    def _longest_keys(self, x: Any, pos: Any, avail: Any) -> tuple[Any, Any]:
        """`(length, replacement offset)` of the longest key of the charsmap trie at every
        position (darts-clone's common prefix search, all positions walked together); length 0
        for none."""
        import tensorflow as tf

        zeros = tf.zeros_like(pos)
        if self._units is None:
            return zeros, zeros
        units = self._units
        size = tf.size(units, out_type=tf.int64)
        t = tf.size(x)

        def offset(unit):
            return tf.bitwise.left_shift(tf.bitwise.right_shift(unit, 10), tf.bitwise.right_shift(unit & 512, 6))

        def body(d, node, alive, best, value):
            alive &= d < avail
            byte = tf.cast(tf.gather(x, tf.minimum(pos + d, t - 1)), tf.int64)
            at = tf.bitwise.bitwise_xor(node, byte)
            unit = tf.gather(units, tf.clip_by_value(at, 0, size - 1))
            match = alive & (at < size) & tf.equal(unit & 0x800000FF, byte)
            child = tf.bitwise.bitwise_xor(at, offset(unit))
            leaf = match & tf.equal(tf.bitwise.right_shift(unit, 8) & 1, 1)
            leaf_value = tf.cast(tf.gather(units, tf.clip_by_value(child, 0, size - 1)) & 0x7FFFFFFF, tf.int32)
            return d + 1, child, match, tf.where(leaf, d + 1, best), tf.where(leaf, leaf_value, value)

        start = tf.fill(tf.shape(pos), offset(units[0]))
        _, _, _, best, value = tf.while_loop(
            lambda d, node, alive, best, value: tf.reduce_any(alive),
            body,
            [tf.constant(0), start, avail > 0, zeros, zeros],
        )
        return best, value

    def _user_matches(self, x: Any, joined: Any, pos: Any, avail: Any) -> Any:
        """The length of the longest user-defined piece at every position (0 for none)."""
        import tensorflow as tf

        if self._user is None:
            return tf.zeros_like(pos)
        where = tf.where(tf.gather(self._user_first, x) & (avail > 0))[:, 0]
        at, left = tf.gather(pos, where), tf.gather(avail, where)
        best = tf.zeros_like(at)
        for n in range(1, self.max_user + 1):
            hit = (self._user.lookup(tf.strings.substr(joined, at, tf.fill(tf.shape(at), n))) >= 0) & (n <= left)
            best = tf.where(hit, n, best)
        return tf.math.unsorted_segment_sum(best, where, tf.size(pos))  # (a scatter refuses an empty output)

    def _normalize(self, texts: Any) -> Any:
        """Strings `[b]` normalized as SentencePiece does (module docstring), as a ragged
        tensor of int32 bytes `[b, None]`."""
        import tensorflow as tf

        spec = self.spec
        lens = tf.strings.length(texts)
        rows = tf.size(lens)
        joined = tf.strings.reduce_join(texts)
        x = tf.cast(tf.io.decode_raw(joined, tf.uint8), tf.int32)
        t = tf.size(x)
        pos = tf.range(t)
        row = tf.repeat(tf.range(rows), lens)
        avail = tf.gather(tf.cumsum(lens), row) - pos
        source, length, used = self._prefixes(x, joined, pos, avail)
        # The positions NormalizePrefix visits: the chain 0, 0 + used, ... through every row.
        visited = _on_chain(tf.concat([pos + used, [t]], 0), 0)[:t]
        at = tf.where(visited)[:, 0]
        source, length, row = tf.gather(source, at), tf.gather(length, at), tf.gather(row, at)
        ranges = tf.ragged.range(source, source + length)
        out = tf.gather(tf.concat([x, self._replacements], 0), ranges.flat_values)
        piece = tf.cast(ranges.value_rowids(), tf.int32)
        if spec.remove_extra_whitespaces:
            # A replacement's leading spaces go when the last non-empty one (in the row) ended
            # with a space, or when none came before.
            space = out == 32
            starts = tf.cast(ranges.row_starts(), tf.int32)
            non_space = tf.cumsum(tf.cast(~space, tf.int32))
            before = tf.gather(tf.concat([[0], non_space], 0), starts)
            leading = tf.equal(non_space, tf.gather(before, piece))
            nonempty = length > 0
            ends_space = nonempty & tf.equal(
                tf.gather(tf.concat([out, [0]], 0), tf.maximum(starts + length - 1, 0)), 32
            )
            earlier = tf.cumsum(tf.cast(nonempty, tf.int32), exclusive=True)
            last = tf.gather(
                tf.concat([tf.cast(tf.where(nonempty)[:, 0], tf.int32), [0]], 0), tf.maximum(earlier - 1, 0)
            )
            follows = (earlier > 0) & tf.equal(tf.gather(tf.concat([row, [0]], 0), last), row)
            after_space = tf.where(follows, tf.gather(tf.concat([ends_space, [False]], 0), last), True)
            keep = ~(leading & tf.gather(after_space, piece))
            out, piece = tf.boolean_mask(out, keep), tf.boolean_mask(piece, keep)
        norm = tf.RaggedTensor.from_value_rowids(out, tf.gather(row, piece), nrows=rows)
        if spec.add_dummy_prefix:
            some = tf.cast(lens > 0, tf.int32)
            norm = tf.concat([tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(some)], 32), some), norm], 1)
        values, row = norm.flat_values, tf.cast(norm.value_rowids(), tf.int32)
        if spec.escape_whitespaces:  # a space becomes U+2581 (3 bytes)
            space = values == 32
            count = tf.where(space, 3, 1)
            first = tf.cumsum(count, exclusive=True)
            within = tf.range(tf.reduce_sum(count)) - tf.repeat(first, count)
            escaped = tf.gather(tf.constant(list(_SPACE)), tf.minimum(within, 2))
            values = tf.where(tf.repeat(space, count), escaped, tf.repeat(values, count))
            row = tf.repeat(row, count)
        if spec.remove_extra_whitespaces:  # trailing spaces (U+2581 when escaped) go
            if spec.escape_whitespaces:
                mark = _marks(values, row)
                unit = mark | _shift(mark, 1) | _shift(mark, 2)
            else:
                unit = values == 32
            after = tf.cumsum(tf.cast(~unit, tf.int32), reverse=True)
            ends = tf.cast(tf.RaggedTensor.from_value_rowids(values, row, nrows=rows).row_limits(), tf.int32)
            trailing = tf.equal(after, tf.gather(tf.concat([after, [0]], 0), tf.gather(ends, row)))
            values, row = tf.boolean_mask(values, ~trailing), tf.boolean_mask(row, ~trailing)
        return tf.RaggedTensor.from_value_rowids(values, row, nrows=rows)

    def normalize(self, texts: Any) -> Any:
        """Strings `[b]` normalized as SentencePiece does (module docstring)."""
        import tensorflow as tf

        norm = self._normalize(tf.convert_to_tensor(texts, tf.string))
        return tf.strings.reduce_join(tf.gather(self._byte_strings, norm), axis=-1)

    # -- segmentation -----------------------------------------------------------------
    def encode(self, texts: Any) -> Any:
        """A 1-D string tensor to a `tf.RaggedTensor` of int32 ids (no EOS)."""
        import tensorflow as tf

        norm = self._normalize(tf.convert_to_tensor(texts, tf.string))
        return _Lattice(self, norm).encode()

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


def _table(keys: list[bytes], values: list[int], default: int) -> Any:
    import tensorflow as tf

    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.constant(values, tf.int64)), default
    )


class _Lattice:
    """SentencePiece's unigram Viterbi (`EncodeOptimized`) over normalized rows, all words of
    all rows stepped together one character at a time (module docstring)."""

    def __init__(self, graph: SentencePieceGraph, norm: Any):
        import tensorflow as tf

        self.graph = graph
        z = norm.flat_values
        zrow = tf.cast(norm.value_rowids(), tf.int32)
        self.rows = tf.cast(norm.nrows(), tf.int32)
        self.n = n = tf.size(z)
        boundary = (z & 0xC0) != 0x80
        starts = tf.cast(tf.where(boundary)[:, 0], tf.int32)  # characters' first bytes
        self.chars = k = tf.size(starts)
        self.ends = ends = tf.concat([starts[1:], [n]], 0)[:k]
        self.char_row = tf.gather(zrow, starts)
        self.first_in_row = tf.concat([[True], self.char_row[1:] != self.char_row[:-1]], 0)[:k]
        word_start = self.first_in_row
        if graph.split_words:
            word_start |= tf.gather(_marks(z, zrow), starts)
        word = tf.cumsum(tf.cast(word_start, tf.int32)) - 1
        first = tf.cast(tf.where(word_start)[:, 0], tf.int32)
        # every candidate: a character's end, a length 1..width back from it within the word
        width = graph._width
        lengths = tf.range(1, width + 1)
        begin = ends[:, None] - lengths[None, :]
        inside = begin >= tf.gather(tf.gather(starts, first), word)[:, None]
        begin = tf.maximum(begin, 0)
        inside &= tf.gather(tf.concat([boundary, [True]], 0), begin)
        where = tf.cast(tf.where(inside), tf.int32)
        joined = tf.strings.reduce_join(tf.gather(graph._byte_strings, z))
        found = graph._piece_ids.lookup(tf.strings.substr(joined, tf.gather_nd(begin, where), where[:, 1] + 1))
        flat = tf.math.unsorted_segment_sum(
            tf.cast(found, tf.int32) + 1, where[:, 0] * width + where[:, 1], tf.size(begin)
        )
        grid = tf.reshape(flat, tf.shape(begin)) - 1
        unk_id = graph.spec.unk_id
        grid = tf.where(tf.one_hot(ends - starts - 1, width, True, False) & (grid < 0), unk_id, grid)
        self.grid = grid
        char_index = tf.cumsum(tf.cast(boundary, tf.int32)) - 1
        opens = tf.gather(tf.concat([char_index, [k]], 0), begin)  # the candidate's first character
        # A character that no candidate spans into starts a word too: all paths pass its start,
        # so the words either side are independent (unknown characters, mostly).
        spans = (grid >= 0) & (opens < tf.range(k)[:, None])
        ramp = tf.math.unsorted_segment_sum(
            tf.concat([tf.ones_like(opens[spans]), -tf.ones_like(opens[spans])], 0),
            tf.concat([opens[spans] + 1, tf.broadcast_to(tf.range(k)[:, None] + 1, tf.shape(opens))[spans]], 0),
            k + 1,
        )
        word_start |= tf.equal(tf.cumsum(ramp)[:k], 0)
        self.word = word = tf.cumsum(tf.cast(word_start, tf.int32)) - 1
        self.first_char = first = tf.cast(tf.where(word_start)[:, 0], tf.int32)
        self.words = tf.size(first)
        self.length = tf.concat([first[1:], [k]], 0) - first
        self.step = tf.range(k) - tf.gather(first, word) + 1
        safe = tf.maximum(grid, 0)
        user = (grid >= 0) & tf.gather(graph._user_defined, safe)
        score = tf.where(user, graph._user_scores[None, :], tf.gather(graph._scores, safe))
        self.score = tf.where(grid == unk_id, graph._unk_score, score)
        # the step (0: the word's start) whose end the candidate starts at
        self.back = opens - tf.gather(first, word)[:, None]

    def viterbi(self, offsets: Any) -> tuple[Any, Any, Any, Any]:
        """Each character's best candidate `(length, id)` as `EncodeOptimized` picks it, the score
        of the best path to its end and whether SentencePiece rebases there; the words start at
        `offsets` (the best path's score at their start). Scores add in float32, the first best
        wins a tie; where a best path's score passes +-`_RESET` (not at a word's end: the next
        word's offset says it) the scores are rebased to 0 there, and a candidate from before
        that point is compared after the rebase, as SentencePiece shifts it."""
        import tensorflow as tf

        g = self.graph
        width = g._width
        ring = width + 1
        words = self.words
        lengths = tf.range(1, width + 1)
        word_ids = tf.broadcast_to(tf.range(words)[:, None], [words, width])
        ring0 = tf.concat([offsets[None, :], tf.zeros([width, words])], 0)
        steps = tf.reduce_max(tf.concat([self.length, [0]], 0))

        def first_best(score, among):
            best = tf.reduce_max(tf.where(among, score, -math.inf), 1)
            tied = among & tf.equal(score, best[:, None])
            return best, tf.reduce_max(tf.where(tied, lengths, 0), 1)  # the earliest start

        def body(t, buf, rebased_at, shift, chosen, ids, values, resets):
            active = t <= self.length
            c = tf.minimum(self.first_char + t - 1, self.chars - 1)
            grid = tf.gather(self.grid, c)
            back = tf.gather(self.back, c)
            here = tf.gather_nd(buf, tf.stack([back % ring, word_ids], -1))
            score = here + tf.gather(self.score, c)
            valid = grid >= 0
            before = valid & (back < rebased_at[:, None])  # started before the last rebase
            best_before, win_before = first_best(score, before)
            best_before = best_before - shift
            best_after, win_after = first_best(score, valid & ~before)
            after = (win_after > 0) & ((win_before == 0) | (best_after > best_before))
            win = tf.where(after, win_after, win_before)
            value = tf.where(after, best_after, best_before)
            rebase = active & (t < self.length) & (tf.abs(value) > _RESET)
            row = tf.equal(tf.range(ring), t % ring)[:, None]  # (a scatter refuses an empty buffer)
            buf = tf.where(row, tf.where(active & ~rebase, value, 0.0)[None, :], buf)
            pick = tf.maximum(win - 1, 0)
            return (
                t + 1,
                buf,
                tf.where(rebase, t, rebased_at),
                tf.where(rebase, value, shift),
                chosen.write(t - 1, win),
                ids.write(t - 1, tf.gather(grid, pick, batch_dims=1)),
                values.write(t - 1, value),
                resets.write(t - 1, rebase),
            )

        def array(dtype):
            return tf.TensorArray(dtype, size=steps, element_shape=[None])

        start = [tf.constant(1), ring0, tf.zeros([words], tf.int32), tf.zeros([words])]
        start += [array(tf.int32), array(tf.int32), array(tf.float32), array(tf.bool)]
        out = tf.while_loop(lambda t, *_: t <= steps, body, start)[4:]
        at = tf.stack([self.step - 1, self.word], -1)

        def stacked(a):  # an empty TensorArray of unknown element shape does not stack
            return tf.cond(steps > 0, a.stack, lambda: tf.zeros([0, words], a.dtype))

        return tuple(tf.gather_nd(stacked(a), at) for a in out)

    def path(self, chosen: Any) -> Any:
        """Which characters end a piece of the best path (backtracking from each row's end)."""
        import tensorflow as tf

        back = tf.maximum(tf.range(self.n + 1) - 1, 0)
        back = tf.tensor_scatter_nd_update(back, self.ends[:, None], self.ends - chosen)
        return tf.gather(_on_chain(back, self.n), self.ends)

    def offsets(self, on_path: Any, chosen: Any, values: Any, resets: Any) -> Any:
        """Each word's offset: the score of the best path at its start, added up along `on_path`
        in the order SentencePiece adds, with its rebases past +-`_RESET` (`viterbi`'s `values`
        and `resets`): float32 cumulative sums (they add in order) of the stretches between
        rebases, one stretch after the other."""
        import tensorflow as tf

        width = self.graph._width
        at = tf.cast(tf.where(on_path)[:, 0], tf.int32)
        slot = tf.stack([at, tf.gather(chosen, at) - 1], -1)
        row = tf.gather(self.char_row, at)
        scores = tf.RaggedTensor.from_value_rowids(tf.gather_nd(self.score, slot), row, nrows=self.rows)
        step = tf.gather(self.step, at)
        span = step - tf.gather_nd(self.back, slot)  # the piece starts at the end of character at - span
        # a rebase inside a piece shifts its end's score; one at its start or at a word's end
        # (the next word's start) starts the next piece from 0
        inner = at[:, None] - tf.range(1, width)[None, :]
        inside = (tf.range(1, width)[None, :] < span[:, None]) & tf.gather(resets, tf.maximum(inner, 0))
        shift = tf.reduce_sum(tf.where(inside, tf.gather(values, tf.maximum(inner, 0)), 0.0), 1)
        crosses = tf.reduce_any(inside, 1)
        begins = (span < step) & tf.gather(resets, tf.maximum(at - span, 0))
        ends_word = tf.equal(step, tf.gather(self.length, tf.gather(self.word, at)))
        zero = tf.concat([begins[1:], [False]], 0)[: tf.size(begins)]

        def dense(x):
            return tf.RaggedTensor.from_value_rowids(x, row, nrows=self.rows).to_tensor()

        score, zero, crosses, shift, ends_word = (
            dense(x) for x in (scores.flat_values, zero, crosses, shift, ends_word)
        )
        index = tf.range(tf.shape(score)[1])[None, :]
        size = tf.cast(scores.row_lengths(), tf.int32)

        def stretch(begin, start, total):
            """From each row's piece `begin` on (its score `start` before it) to the first rebase."""
            rest = index >= begin[:, None]
            acc = tf.cumsum(
                tf.where(index == begin[:, None], start[:, None] + score, tf.where(rest, score, 0.0)), axis=1
            )
            acc = tf.where(crosses, acc - shift, acc)
            stop = rest & (zero | crosses | (ends_word & (tf.abs(acc) > _RESET)))
            end = tf.reduce_min(tf.where(stop, index, tf.shape(score)[1]), 1)
            last = tf.equal(index, end[:, None])
            after = tf.reduce_sum(tf.where(last, acc, 0.0), 1)
            after = tf.where(tf.reduce_any(last & (zero | (ends_word & (tf.abs(acc) > _RESET))), 1), 0.0, after)
            total = tf.where(last, after[:, None], tf.where(rest & (index < end[:, None]), acc, total))
            return end + 1, after, total

        begin = tf.zeros([self.rows], tf.int32)
        total = tf.while_loop(
            lambda begin, *_: tf.reduce_any(begin < size), stretch, [begin, tf.zeros([self.rows]), score]
        )[2]
        total = tf.RaggedTensor.from_tensor(total, lengths=scores.row_lengths()).flat_values
        position = tf.cumsum(tf.cast(on_path, tf.int32)) - 1
        before = tf.gather(position, tf.maximum(self.first_char - 1, 0))
        start = tf.gather(total, tf.maximum(before, 0))
        return tf.where(tf.gather(self.first_in_row, self.first_char), 0.0, start)

    def encode(self) -> Any:
        """The rows' ids (a ragged int32 tensor), consecutive UNKs merged."""
        import tensorflow as tf

        def settle(_, offsets, *__):
            chosen, ids, values, resets = self.viterbi(offsets)
            on = self.path(chosen)
            return offsets, self.offsets(on, chosen, values, resets), on, ids

        # The words' offsets depend on the path before them: start from 0, add up along the path
        # found and step again until the offsets no longer change.
        state = settle(None, tf.zeros([self.words]))
        state = tf.while_loop(lambda a, b, *_: tf.reduce_any(tf.not_equal(a, b)), settle, state)
        on, ids = state[2], state[3]
        at = tf.where(on)[:, 0]
        ids, row = tf.gather(ids, at), tf.gather(self.char_row, at)
        unk = tf.equal(ids, self.graph.spec.unk_id)
        repeat = unk & tf.concat([[False], unk[:-1] & tf.equal(row[1:], row[:-1])], 0)
        return tf.RaggedTensor.from_value_rowids(
            tf.boolean_mask(ids, ~repeat), tf.boolean_mask(row, ~repeat), nrows=self.rows
        )


def _on_chain(step: Any, source: Any) -> Any:
    """Which nodes the walk from `source` along `step` (a node to the next, toward a node that
    steps to itself) reaches, found by pointer doubling: log2(walk length) rounds of gathers."""
    import tensorflow as tf

    nodes = tf.range(tf.size(step))
    depth = tf.cast(step != nodes, tf.int32)

    def double(k, jump, depth, levels):
        return k + 1, tf.gather(jump, jump), depth + tf.gather(depth, jump), levels.write(k, jump)

    levels = tf.TensorArray(tf.int32, size=0, dynamic_size=True, clear_after_read=False, element_shape=[None])
    k, jump, depth, levels = tf.while_loop(
        lambda k, jump, depth, levels: tf.reduce_any(tf.gather(depth, jump) > 0),
        double,
        [tf.constant(0), step, depth, levels],
    )
    levels = levels.write(k, jump)
    ahead = tf.gather(depth, source) - depth  # steps from the source to each node, if on its walk

    def hop(i, at):
        bit = tf.equal(tf.bitwise.right_shift(ahead, i) & 1, 1)
        return i + 1, tf.where(bit, tf.gather(levels.read(i), at), at)

    _, at = tf.while_loop(lambda i, at: i <= k, hop, [tf.constant(0), tf.fill(tf.shape(nodes), source)])
    return (ahead >= 0) & tf.equal(at, nodes)


def _marks(values: Any, row: Any) -> Any:
    """Where U+2581 starts in flat bytes `values` (its three bytes in one row)."""
    import tensorflow as tf

    n = tf.size(values)
    padded = tf.concat([values, [-1, -1]], 0)
    rows = tf.concat([row, [-1, -1]], 0)
    e2, x96, x81 = list(_SPACE)
    return (
        tf.equal(values, e2)
        & tf.equal(padded[1 : n + 1], x96)
        & tf.equal(padded[2 : n + 2], x81)
        & tf.equal(rows[2 : n + 2], row)
    )


def _shift(mask: Any, k: int) -> Any:
    """`mask` moved `k` places later (False shifted in)."""
    import tensorflow as tf

    return tf.concat([tf.zeros([k], tf.bool), mask], 0)[: tf.size(mask)]
