"""A seeded bijection over `[0, n)` computed on the fly: Feistel network + cycle walking.

`Permutation(n, key)(i)` maps indices to indices without materialising the permutation
(O(1) memory). The network permutes `[0, 4^h)` for the smallest `h` with `4^h >= n`;
values that land at or above `n` are walked again through the network until they fall
inside (the walk terminates because the network is a bijection on the larger domain).
Everything is vectorised over NumPy uint64 arrays.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cairn.datatasks.deterministic.seeds import derive

_ROUNDS = 6
_CHUNK = 1 << 16  # indices per vectorised block (its temporaries stay in the CPU cache)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (a bijective 64-bit mixer), elementwise, wrapping."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


@dataclasses.dataclass(frozen=True)
class Permutation:
    """A bijection over `[0, n)` determined by `key` (an int)."""

    n: int
    key: int

    def __post_init__(self):
        if not isinstance(self.n, (int, np.integer)) or self.n < 1:
            raise ValueError(f"Permutation needs n >= 1, got {self.n!r}")
        object.__setattr__(self, "_keys", np.array([derive(self.key, "feistel", r) for r in range(_ROUNDS)], np.uint64))

    @property
    def half_bits(self) -> int:
        bits = max(1, int(self.n - 1).bit_length())
        return max(1, (bits + 1) // 2)

    def _network(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """The Feistel rounds: `left, right = right, left ^ (_mix(right ^ k) & mask)`,
        computed in place in three buffers (no temporary per operation)."""
        h = np.uint64(self.half_bits)
        mask = np.uint64((1 << self.half_bits) - 1)
        left, right = x >> h, x & mask
        t, u = np.empty_like(x), np.empty_like(x)
        for k in keys:
            np.bitwise_xor(right, k, out=t)
            np.right_shift(t, _S30, out=u)  # _mix(t), in place
            t ^= u
            t *= _M1
            np.right_shift(t, _S27, out=u)
            t ^= u
            t *= _M2
            np.right_shift(t, _S31, out=u)
            t ^= u
            t &= mask
            t ^= left
            left, right, t = right, t, left
        left <<= h
        left |= right
        return left

    def __call__(self, index: np.ndarray | int) -> np.ndarray:
        """The images of `index` (array or scalar) under the permutation."""
        scalar = np.ndim(index) == 0
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"Permutation over [0, {self.n}): index out of range")
        if self.n == 1:
            out = np.zeros_like(idx)
            return out[0] if scalar else out
        if idx.size <= _CHUNK:
            out = self._apply(idx)
        else:  # blocks that stay in the CPU cache: the same values, several times faster
            out = np.empty_like(idx)
            for at in range(0, idx.size, _CHUNK):
                out[at : at + _CHUNK] = self._apply(idx[at : at + _CHUNK])
        return out[0] if scalar else out

    def range(self, start: int, stop: int) -> np.ndarray:
        """The images of `start .. stop - 1` (as `self(np.arange(start, stop))`)."""
        return self(np.arange(start, stop, dtype=np.int64))

    def _apply(self, idx: np.ndarray) -> np.ndarray:
        keys = self._keys  # type: ignore[attr-defined]
        x = self._network(idx.astype(np.uint64), keys)
        todo = np.nonzero(x >= np.uint64(self.n))[0]
        while todo.size:
            y = self._network(x[todo], keys)
            x[todo] = y
            todo = todo[y >= np.uint64(self.n)]
        return x.astype(np.int64)
