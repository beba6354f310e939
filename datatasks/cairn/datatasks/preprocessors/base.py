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

`Preprocessor` is the typed form: a callable object that declares the features it reads
and writes, whether it is deterministic, and optionally its length rule (`LengthRule`:
what it needs of `sequence_length`) and its per-example `output_lengths`. `@preprocessor`
returns one; `as_preprocessor` wraps any plain callable (or a `functools.partial` of
either), reading the legacy attributes `deterministic`, `deterministic_lengths` and
`check_sequence_length`, so plain functions keep working everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.tf_data import map_inline, no_autograph

INJECTED = ("output_features", "sequence_length", "seed", "bad_data_policy", "stats")


def _params(fn: Callable) -> Sequence[str]:
    target = fn.func if isinstance(fn, functools.partial) else fn
    try:
        names = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return ()
    if isinstance(fn, functools.partial):
        names = [n for n in names if n not in fn.keywords]
    return names


def _accepted(fn: Callable, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `kwargs` that `fn` can take (all of them if it takes `**kwargs`)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(kwargs)
    names = {p.name for p in params}
    return {k: v for k, v in kwargs.items() if k in names}


@dataclasses.dataclass(frozen=True)
class LengthRule:
    """What a preprocessor needs of `sequence_length`, for a given one.

    `reads`: tokens per example it takes of each feature it reads to fill the lengths;
    `needs`: the least `sequence_length[k]` for each feature it writes; `about`: a phrase
    for messages (e.g. "span corruption of inputs length 64").
    """

    reads: Mapping[str, int]
    needs: Mapping[str, int]
    about: str

    def problem(self, sequence_length: Mapping[str, int]) -> str | None:
        """A message when `sequence_length` is below what the rule needs, else None."""
        for k, least in sorted(self.needs.items()):
            have = sequence_length.get(k)
            if have is not None and have < least:
                return f"sequence_length[{k!r}] is {have}: {self.about} needs {k} >= {least}"
        return None


class Preprocessor:
    """A preprocessor `dataset -> dataset` that says what it does (callable as before).

    `reads`/`writes`: the features it reads and writes (documentation and checks;
    empty when not declared). `deterministic`: `None` infers it (not deterministic when
    the function takes `seed`/`seeds`). `length_rule(sequence_length, **kwargs) ->
    LengthRule` raises `ValueError` when no rule can hold; `output_lengths(lengths,
    sequence_length, output_features, **kwargs) -> lengths` maps per-example lengths
    (NumPy arrays by feature) the way the preprocessor does, so packing can be planned.
    `numpy_fn(features, sequence_length, output_features, **kwargs) -> features` (optional)
    does the same work on a batch of examples held as `{feature: ragged.Ragged}` (the
    numeric features); with it, the deterministic reader runs the preprocessor after the
    cache without TensorFlow. A seeded (not deterministic) preprocessor's `numpy_fn` also
    gets `seed=` `[N, 2]`: each example's own seed, the one this preprocessor gets from
    `Task.preprocess` when the example is alone in its stream (it is example 0 there);
    its results must equal the TensorFlow version's bit for bit (`seeded_numpy`).
    """

    def __init__(
        self,
        fn: Callable,
        *,
        reads: Sequence[str] = (),
        writes: Sequence[str] = (),
        deterministic: bool | None = None,
        length_rule: Callable | None = None,
        output_lengths: Callable | None = None,
        numpy_fn: Callable | None = None,
    ):
        if not callable(fn):
            raise TypeError(f"a preprocessor must be callable, got {type(fn).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.reads = tuple(reads)
        self.writes = tuple(writes)
        if deterministic is None:
            deterministic = getattr(fn, "deterministic", None)
        self.deterministic = (
            bool(deterministic)
            if deterministic is not None
            else "seed" not in _params(fn) and "seeds" not in _params(fn)
        )
        self.length_rule = length_rule
        self.numpy_fn = numpy_fn
        self.deterministic_lengths = output_lengths or getattr(fn, "deterministic_lengths", None)
        self._legacy_check = getattr(fn, "check_sequence_length", None)

    @property
    def output_lengths(self) -> Callable | None:
        """`f(lengths, sequence_length, output_features, **kwargs) -> lengths`, or None."""
        return self.deterministic_lengths

    def __call__(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        return self.fn(dataset, *args, **kwargs)

    def __repr__(self) -> str:
        return f"Preprocessor({getattr(self, '__qualname__', repr(self.fn))})"

    def __reduce__(self) -> Any:
        # A module-level preprocessor pickles by reference (its function's qualified name
        # now names this object), anything else by value.
        module = sys.modules.get(getattr(self, "__module__", ""), None)
        if module is not None and getattr(module, getattr(self, "__qualname__", ""), None) is self:
            return self.__qualname__
        return (
            _rebuild,
            (
                self.fn,
                self.reads,
                self.writes,
                self.deterministic,
                self.length_rule,
                self.deterministic_lengths,
                self.numpy_fn,
            ),
        )

    def lengths_for(self, sequence_length: Mapping[str, int], **kwargs: Any) -> LengthRule | None:
        """The length rule for `sequence_length` (None when it has none); `kwargs` are the
        preprocessor's own arguments (those the rule takes are passed on)."""
        if self.length_rule is None:
            return None
        return self.length_rule(sequence_length, **_accepted(self.length_rule, kwargs))

    def check_sequence_length(self, sequence_length: Mapping[str, int], **kwargs: Any) -> str | None:
        """A message naming the problem when `sequence_length` cannot work, else None."""
        if self.length_rule is None:
            if self._legacy_check is None:
                return None
            return self._legacy_check(sequence_length, **_accepted(self._legacy_check, kwargs))
        try:
            lengths = self.lengths_for(sequence_length, **kwargs)
            return lengths.problem(sequence_length) if lengths is not None else None
        except ValueError as e:
            return str(e)

    def bind(self, *args: Any, **kwargs: Any) -> Preprocessor:
        """This preprocessor with arguments bound (`functools.partial` keeps its rules)."""

        def rule(sequence_length, **more):
            return self.lengths_for(sequence_length, **{**kwargs, **more})

        def lengths(lengths_, sequence_length, output_features, **more):
            fn = self.deterministic_lengths
            return fn(lengths_, sequence_length, output_features, **_accepted(fn, {**kwargs, **more}))

        def numpy_fn(features, sequence_length, output_features, **more):
            fn = self.numpy_fn
            return fn(features, sequence_length, output_features, **_accepted(fn, {**kwargs, **more}))

        bound = Preprocessor(
            functools.partial(self.fn, *args, **kwargs),
            reads=self.reads,
            writes=self.writes,
            deterministic=self.deterministic,
            length_rule=rule if self.length_rule else None,
            output_lengths=lengths if self.deterministic_lengths else None,
            numpy_fn=numpy_fn if self.numpy_fn else None,
        )
        if self.length_rule is None and self._legacy_check is not None:
            bound._legacy_check = lambda sl, **more: self.check_sequence_length(sl, **{**kwargs, **more})
        return bound


def _rebuild(fn, reads, writes, deterministic, length_rule, output_lengths, numpy_fn=None) -> Preprocessor:
    return Preprocessor(
        fn,
        reads=reads,
        writes=writes,
        deterministic=deterministic,
        length_rule=length_rule,
        output_lengths=output_lengths,
        numpy_fn=numpy_fn,
    )


def as_preprocessor(fn: Callable) -> Preprocessor:
    """`fn` as a `Preprocessor`: itself, a partial of one bound, or a plain callable wrapped."""
    if isinstance(fn, Preprocessor):
        return fn
    if isinstance(fn, functools.partial):
        return as_preprocessor(fn.func).bind(*fn.args, **fn.keywords)
    return Preprocessor(fn)


def preprocessor(
    deterministic: bool | None = True,
    *,
    reads: Sequence[str] = (),
    writes: Sequence[str] = (),
    length_rule: Callable | None = None,
    output_lengths: Callable | None = None,
    numpy_fn: Callable | None = None,
) -> Callable[[Callable], Preprocessor]:
    """Decorator: the function as a `Preprocessor` declaring what it does."""

    def make(fn: Callable) -> Preprocessor:
        return Preprocessor(
            fn,
            reads=reads,
            writes=writes,
            deterministic=deterministic,
            length_rule=length_rule,
            output_lengths=output_lengths,
            numpy_fn=numpy_fn,
        )

    return make


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


@no_autograph
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


def map_over_dataset(
    fn: Callable | None = None, *, num_seeds: int | None = None, num_parallel_calls: int | None = None
) -> Callable:
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

            wrapper.deterministic = getattr(map_fn, "deterministic", True)  # type: ignore[attr-defined]
            return wrapper

        @functools.wraps(map_fn)
        def seeded(ds: tf.data.Dataset, *args: Any, seed: Any = None, **kwargs: Any) -> tf.data.Dataset:
            key = base_key(seed)

            def one(i, x):
                seeds = example_seeds(key, i, num_seeds)
                if num_seeds == 1:
                    return map_fn(x, *args, seed=seeds[0], **kwargs)
                return map_fn(x, *args, seeds=seeds, **kwargs)

            return apply(ds.enumerate(), one)

        seeded.deterministic = False  # type: ignore[attr-defined]
        seeded.__signature__ = _with_seed(map_fn)  # type: ignore[attr-defined]
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
