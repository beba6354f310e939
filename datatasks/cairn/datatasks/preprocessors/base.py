"""How preprocessors are declared and called: determinism flags, injected arguments, seeds.

A preprocessor is `fn(dataset, **kwargs) -> dataset`. The task passes only the keyword
arguments the function names among `output_features`, `sequence_length`, `seed`,
`bad_data_policy` and `stats` (as seqio does for the first two).

Each preprocessor declares whether it is deterministic (`@preprocessor(deterministic=...)`
or the `deterministic` attribute); one that is not declared counts as deterministic unless
it takes a `seed`. `cacheable_prefix` is where a cache must stop: at the first one that
is not deterministic or that needs `sequence_length`.

Seeds (`map_over_dataset(num_seeds=n)`): the task gives each seeded preprocessor a base key
derived from (task seed, epoch, preprocessor position); example `i` of the stream gets
`stateless_split(stateless_fold_in(key, i), n)`. Nothing depends on a counter or the clock.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from cairn.datatasks.inline import map_inline

INJECTED = ("output_features", "sequence_length", "seed", "bad_data_policy", "stats")


def preprocessor(deterministic: bool = True) -> Callable:
    """Decorator declaring whether a preprocessor is deterministic."""

    def mark(fn):
        fn.deterministic = deterministic
        return fn

    return mark


def _params(fn: Callable) -> Sequence[str]:
    target = fn.func if isinstance(fn, functools.partial) else fn
    try:
        names = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return ()
    if isinstance(fn, functools.partial):
        names = [n for n in names if n not in fn.keywords]
    return names


def is_deterministic(fn: Callable) -> bool:
    """Whether `fn` declares (or is taken to be) deterministic."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    flag = getattr(target, "deterministic", None)
    if flag is not None:
        return bool(flag)
    return "seed" not in _params(fn) and "seeds" not in _params(fn)


def needs_sequence_length(fn: Callable) -> bool:
    return "sequence_length" in _params(fn)


def cacheable_prefix(preprocessors: Sequence[Callable]) -> int:
    """Number of leading preprocessors a cache may run (deterministic, length-free)."""
    for i, fn in enumerate(preprocessors):
        if not is_deterministic(fn) or needs_sequence_length(fn):
            return i
    return len(preprocessors)


def call_preprocessor(fn: Callable, ds: tf.data.Dataset, **available: Any) -> tf.data.Dataset:
    """Calls `fn(ds, ...)` with those of `available` that `fn` names."""
    names = _params(fn)
    kwargs = {k: v for k, v in available.items() if k in names and k in INJECTED}
    return fn(ds, **kwargs)


def example_seeds(key: tf.Tensor, index: tf.Tensor, num_seeds: int) -> tf.Tensor:
    """`[num_seeds, 2]` int32 seeds for example `index` from the base `key` (shape [2])."""
    key = tf.cast(key, tf.int64)
    folded = tf.random.experimental.stateless_fold_in(key, tf.cast(index, tf.int64))
    return tf.cast(tf.random.experimental.stateless_split(folded, num_seeds), tf.int32)


def base_key(seed: Any) -> tf.Tensor:
    """A `[2]` int64 key from an int, a pair, or a tensor; `None` means 0."""
    if seed is None:
        seed = 0
    seed = tf.cast(seed if isinstance(seed, tf.Tensor) else tf.convert_to_tensor(seed), tf.int64)
    if seed.shape.rank == 0:
        seed = tf.stack([seed, tf.constant(0, tf.int64)])
    return seed


def map_over_dataset(fn: Callable | None = None, *, num_seeds: int | None = None,
                     num_parallel_calls: int | None = None) -> Callable:
    """Turns `fn(example, ...)` into a preprocessor `fn(dataset, ...)` (seqio's decorator).

    With `num_seeds=1` the function receives `seed=` (shape [2]); with more, `seeds=`
    (shape [num_seeds, 2]), derived from (seed, example index). By default `fn` runs
    inline (`inline.map_inline`: no thread hand-offs, the fastest for the small per-example
    functions preprocessors usually are); give `num_parallel_calls` (e.g.
    `tf.data.AUTOTUNE`) for an expensive `fn` worth spreading over cores.
    """

    def apply(ds: tf.data.Dataset, f: Callable) -> tf.data.Dataset:
        if num_parallel_calls is None:
            return map_inline(ds, f)
        return ds.map(f, num_parallel_calls=num_parallel_calls, deterministic=True)

    def decorate(map_fn: Callable) -> Callable:
        if not num_seeds:
            @functools.wraps(map_fn)
            def wrapper(ds: tf.data.Dataset, *args: Any, **kwargs: Any) -> tf.data.Dataset:
                return apply(ds, lambda x: map_fn(x, *args, **kwargs))

            wrapper.deterministic = getattr(map_fn, "deterministic", True)
            return wrapper

        @functools.wraps(map_fn)
        def seeded(ds: tf.data.Dataset, *args: Any, seed: Any = None,
                   **kwargs: Any) -> tf.data.Dataset:
            key = base_key(seed)

            def one(i, x):
                seeds = example_seeds(key, i, num_seeds)
                if num_seeds == 1:
                    return map_fn(x, *args, seed=seeds[0], **kwargs)
                return map_fn(x, *args, seeds=seeds, **kwargs)

            return apply(ds.enumerate(), one)

        seeded.deterministic = False
        seeded.__signature__ = _with_seed(map_fn)
        return seeded

    return decorate(fn) if fn is not None else decorate


def _with_seed(map_fn: Callable) -> inspect.Signature:
    sig = inspect.signature(map_fn)
    params = [inspect.Parameter("dataset", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    rest = [p for p in list(sig.parameters.values())[1:] if p.name not in ("seed", "seeds")]
    var_kw = [p for p in rest if p.kind == inspect.Parameter.VAR_KEYWORD]
    params += [p for p in rest if p.kind != inspect.Parameter.VAR_KEYWORD]
    params.append(inspect.Parameter("seed", inspect.Parameter.KEYWORD_ONLY, default=None))
    params += var_kw
    return sig.replace(parameters=params)
