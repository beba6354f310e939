"""TensorFlow's stateless random ops on CPU, bit for bit, in NumPy (no TensorFlow).

What `tf.random.experimental.stateless_fold_in`, `stateless_split` and
`tf.random.stateless_uniform` give with `alg="auto_select"` on CPU, which is Philox-4x32-10:

* A `[2]` seed (int32 values sign-extended to 64 bits, or int64) becomes a Philox key and
  counter: one Philox block of counter `(lo s0, hi s0, lo s1, hi s1)` under the fixed key
  `(0x3EC8F720, 0x02461E29)` gives `mix`; key = `mix[0:2]`, counter = `(0, 0, mix[2], mix[3])`.
* The op's 32-bit words are the blocks `philox(counter + b)`, `b = 0, 1, ...` (a 128-bit
  add), four words a block, in order.
* float32 in [0, 1): `((w & 0x7FFFFF) | 0x3F800000)` as a float, minus 1 (that is
  `(w & 0x7FFFFF) / 2**23`, exactly). int32 in [lo, hi): `lo + w % (hi - lo)` (32-bit
  wrap-around); int64: the word pair `w[2i] | w[2i + 1] << 32`, then the same. Full-range
  ints: the word itself (int32), or the pair (int64).
* `fold_in(seed, data)` = `[full-range scalar of data's dtype from seed, data]`;
  `split(seed, n)` = full-range ints of seed's dtype, shape `[n, 2]`.

Every function takes seeds with any leading shape (`[..., 2]`) and works on all of them at
once. `tests/datatasks/stateless_numpy_test.py` compares them with TensorFlow.
"""

from __future__ import annotations

import numpy as np

_W32A, _W32B = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_M4x32A, _M4x32B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_SEED_KEY = (0x3EC8F720, 0x02461E29)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox-4x32-10 blocks: `counter [..., 4]`, `key [..., 2]` (uint32) -> `[..., 4]` uint32."""
    c = [np.asarray(counter[..., i], np.uint32) for i in range(4)]
    k0 = np.array(key[..., 0], np.uint32)
    k1 = np.array(key[..., 1], np.uint32)
    with np.errstate(over="ignore"):
        for r in range(10):
            if r:
                k0 += _W32A
                k1 += _W32B
            p0 = _M4x32A * c[0].astype(np.uint64)
            p1 = _M4x32B * c[2].astype(np.uint64)
            hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & _MASK32).astype(np.uint32)
            hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & _MASK32).astype(np.uint32)
            c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return np.stack(c, axis=-1)


def _as_seed(seed: np.ndarray) -> np.ndarray:
    seed = np.asarray(seed)
    if seed.dtype not in (np.int32, np.int64) or seed.shape[-1:] != (2,):
        raise ValueError(f"a seed is [..., 2] int32 or int64; got {seed.dtype} {seed.shape}")
    return seed


def key_counter(seed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Philox `(key [..., 2], counter [..., 4])` (uint32) of seeds `[..., 2]`
    (TensorFlow's `StatelessRandomGetKeyCounter` on CPU)."""
    s = _as_seed(seed).astype(np.int64).view(np.uint64)
    lo, hi = (s & _MASK32).astype(np.uint32), (s >> np.uint64(32)).astype(np.uint32)
    counter = np.stack([lo[..., 0], hi[..., 0], lo[..., 1], hi[..., 1]], axis=-1)
    mix = philox(counter, np.broadcast_to(np.array(_SEED_KEY, np.uint32), counter.shape[:-1] + (2,)))
    zero = np.zeros_like(mix[..., 0])
    return mix[..., :2], np.stack([zero, zero, mix[..., 2], mix[..., 3]], axis=-1)


def _add_counter(counter: np.ndarray, n: np.ndarray) -> np.ndarray:
    """`counter + n` as 128-bit numbers (word 0 lowest); `n` < 2**32, broadcast."""
    n = np.asarray(n, np.uint64)
    c = counter.astype(np.uint64)
    w0 = c[..., 0] + n
    carry = w0 >> np.uint64(32)
    w1 = c[..., 1] + carry
    carry = w1 >> np.uint64(32)
    w2 = c[..., 2] + carry
    carry = w2 >> np.uint64(32)
    w3 = c[..., 3] + carry
    return (np.stack([w0, w1, w2, w3], axis=-1) & _MASK32).astype(np.uint32)


def random_words(seed: np.ndarray, n: int) -> np.ndarray:
    """The first `n` 32-bit words an op draws from each seed: `[..., 2]` -> `[..., n]` uint32."""
    key, counter = key_counter(seed)
    blocks = -(-n // 4)
    b = np.arange(blocks, dtype=np.uint64)
    keys = np.broadcast_to(key[..., None, :], key.shape[:-1] + (blocks, 2))
    out = philox(_add_counter(counter[..., None, :], b), keys)
    return out.reshape(out.shape[:-2] + (blocks * 4,))[..., :n]


def ragged_words(seed: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The first `counts[i]` words of seed `i` (`seed [N, 2]`), concatenated: `[sum(counts)]`."""
    counts = np.asarray(counts, np.int64)
    key, counter = key_counter(seed)
    blocks = -(-counts // 4)
    row = np.repeat(np.arange(counts.size), blocks)
    first = np.cumsum(blocks) - blocks
    b = np.arange(row.size, dtype=np.int64) - np.repeat(first, blocks)
    words = philox(_add_counter(counter[row], b.astype(np.uint64)), key[row]).reshape(-1)
    # Keep the first counts[i] words of each row's 4 * blocks[i].
    pos = np.arange(words.size, dtype=np.int64) - np.repeat(4 * first, 4 * blocks)
    return words[pos < np.repeat(counts, 4 * blocks)]


def words_to_float32(words: np.ndarray) -> np.ndarray:
    """float32 in [0, 1) from 32-bit words, as TensorFlow's CPU kernels make them."""
    w = (np.asarray(words, np.uint32) & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)
    return w.view(np.float32) - np.float32(1.0)


def _pairs(words: np.ndarray) -> np.ndarray:
    w = words.astype(np.uint64)
    return w[..., 0::2] | (w[..., 1::2] << np.uint64(32))


def uniform_full_int(seed: np.ndarray, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """`stateless_uniform(shape, seed, minval=None, maxval=None, dtype)`: `[..., *shape]`."""
    size = int(np.prod(shape, dtype=np.int64))
    lead = np.shape(seed)[:-1]
    if np.dtype(dtype) == np.int32:
        out = random_words(seed, size).view(np.int32)
    elif np.dtype(dtype) == np.int64:
        out = _pairs(random_words(seed, 2 * size)).view(np.int64)
    else:
        raise ValueError(f"full-range ints are int32 or int64, not {np.dtype(dtype)}")
    return out.reshape(lead + tuple(shape))


def uniform_float32(seed: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`stateless_uniform(shape, seed)` (float32 in [0, 1)): `[..., *shape]`."""
    size = int(np.prod(shape, dtype=np.int64))
    return words_to_float32(random_words(seed, size)).reshape(np.shape(seed)[:-1] + tuple(shape))


def uniform_int(
    seed: np.ndarray, shape: tuple[int, ...], minval: np.ndarray | int, maxval: np.ndarray | int, dtype: type = np.int32
) -> np.ndarray:
    """`stateless_uniform(shape, seed, minval, maxval, dtype)` for int32/int64: `[..., *shape]`.
    `minval`/`maxval` may be arrays (one per seed, broadcast against `seed[..., 0]`)."""
    lead = np.shape(seed)[:-1]
    size = int(np.prod(shape, dtype=np.int64))
    extra = (1,) * len(shape)
    dt = np.dtype(dtype)
    lo = np.broadcast_to(np.asarray(minval, dt), lead).reshape(lead + extra)
    hi = np.broadcast_to(np.asarray(maxval, dt), lead).reshape(lead + extra)
    if np.any(hi <= lo):
        raise ValueError("stateless_uniform needs maxval > minval")
    if dt == np.int32:
        words = random_words(seed, size).reshape(lead + tuple(shape))
        range32 = (hi.astype(np.int64) - lo.astype(np.int64)).astype(np.uint32)
        return (lo.view(np.uint32) + words % range32).view(np.int32)
    if dt == np.int64:
        bits = _pairs(random_words(seed, 2 * size)).reshape(lead + tuple(shape))
        with np.errstate(over="ignore"):
            range64 = hi.view(np.uint64) - lo.view(np.uint64)
            return (lo.view(np.uint64) + bits % range64).view(np.int64)
    raise ValueError(f"uniform ints are int32 or int64, not {dt}")


def fold_in(seed: np.ndarray, data: np.ndarray | int, dtype: type = np.int32) -> np.ndarray:
    """`stateless_fold_in(seed, data)` with `data` of `dtype` (a Python int is int32 in
    TensorFlow when it fits): `[..., 2]` of `dtype`."""
    seed = _as_seed(seed)
    first = uniform_full_int(seed, (), dtype)
    return np.stack([first, np.broadcast_to(np.asarray(data, dtype), first.shape)], axis=-1)


def split(seed: np.ndarray, num: int = 2) -> np.ndarray:
    """`stateless_split(seed, num)`: `[..., num, 2]` of the seed's dtype."""
    seed = _as_seed(seed)
    return uniform_full_int(seed, (num, 2), seed.dtype.type)


def argsort(values: np.ndarray) -> np.ndarray:
    """`tf.argsort` along the last axis (ascending; equal values keep their order, as
    TensorFlow's top-k of the negated values does)."""
    return np.argsort(values, axis=-1, kind="stable")
