"""Reading t5x checkpoints (`checkpoint_<step>/`) into Cairn parameters.

A t5x checkpoint directory holds `checkpoint`, a msgpack file (flax serialization) of
`{"version": 3, "optimizer": {"target": params, "state": {"step", "param_states"}}}` (version 0:
the optimizer dict at the top), and one TensorStore zarr array per partitioned parameter
(`target.encoder.layers_0.attention.query.kernel/`, gzip-compressed chunks). In the msgpack a
partitioned parameter is its TensorStore spec (a dict with `driver: zarr` and a `kvstore`
path relative to the checkpoint directory); an unpartitioned one is the array itself.

t5x's T5 parameter names are Cairn's with `/kernel` after each dense layer and `logits_dense`
for the untied output layer; t5x's `DenseGeneral` stores attention kernels flattened to two
dimensions (`[embed, heads * head_dim]`, `[heads * head_dim, embed]`), which are reshaped to
Cairn's `[embed, heads, head_dim]` / `[heads, head_dim, embed]`. A scanned Cairn model gets the
`layers_<i>` parameters stacked on the leading `layers` axis. Only the parameters (`target`)
are read; the optimizer state is not. `export_t5x` writes Cairn parameters back in that
layout (2-D and larger arrays in TensorStore, the rest inline), for t5x to restore.

TensorStore (a dependency of orbax-checkpoint) is imported only when a parameter is stored
in it. This reader was checked against checkpoints written in t5x's documented layout by
TensorStore here (tests/models/t5x_checkpoint_test.py), not against t5x itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from cairn import storage

_LAYER = re.compile(r"^layers_(\d+)$")


class T5xCheckpointError(ValueError):
    """A t5x checkpoint that cannot be read into the model: names the file or the tensor."""


def checkpoint_file(path: str, step: int | None = None) -> str:
    """The `checkpoint` msgpack file of `path`: the file itself, a `checkpoint_<step>` folder,
    or a model folder holding `checkpoint_<step>` folders (the latest, or `step`)."""
    p = storage.path(path)
    if p.is_file():
        return str(p)
    if (p / "checkpoint").exists():
        return str(p / "checkpoint")
    if not p.is_dir():
        raise T5xCheckpointError(f"t5x checkpoint {path!r}: no such file or folder")
    steps = sorted(int(c.name.split("_")[1]) for c in p.iterdir() if re.fullmatch(r"checkpoint_\d+", c.name))
    if not steps:
        raise T5xCheckpointError(f"t5x checkpoint {path!r}: no checkpoint file and no checkpoint_<step> folder")
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise T5xCheckpointError(f"t5x checkpoint {path!r}: no step {step} (steps: {steps})")
    return str(p / f"checkpoint_{chosen}" / "checkpoint")


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        name = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v.get("driver") is None:
            out.update(_flatten(v, name))
        else:
            out[name] = v
    return out


def _read_tensorstore(spec: Mapping[str, Any], directory: str, name: str) -> np.ndarray:
    import tensorstore as ts

    spec = {**spec, "kvstore": dict(spec.get("kvstore", {}))}
    kv = spec["kvstore"]
    relative = kv.get("path", spec.pop("path", None))
    if relative is None:
        raise T5xCheckpointError(f"t5x checkpoint: the TensorStore spec of {name!r} has no path")
    full = relative if os.path.isabs(relative) or "://" in relative else f"{directory.rstrip('/')}/{relative}"
    if full.startswith("gs://"):
        bucket, _, rest = full[len("gs://") :].partition("/")
        spec["kvstore"] = {"driver": "gcs", "bucket": bucket, "path": rest}
    else:
        spec["kvstore"] = {"driver": "file", "path": full}
    try:
        return np.asarray(ts.open(spec, open=True, read=True).result().read().result())
    except Exception as e:
        raise T5xCheckpointError(f"t5x checkpoint: cannot read {name!r} from {full}: {e}") from None


def read_params(path: str, step: int | None = None) -> dict[str, np.ndarray]:
    """The `target` parameters of a t5x checkpoint, flat, by t5x name (`encoder/layers_0/
    attention/query/kernel`), as NumPy arrays."""
    from flax import serialization

    file = checkpoint_file(path, step)
    try:
        contents = serialization.msgpack_restore(storage.read_bytes(file))
    except Exception as e:
        raise T5xCheckpointError(f"t5x checkpoint {file}: not a msgpack checkpoint ({type(e).__name__}: {e})") from None
    optimizer = contents.get("optimizer", contents) if contents.get("version", 0) else contents
    if not isinstance(optimizer, Mapping) or "target" not in optimizer:
        raise T5xCheckpointError(f"t5x checkpoint {file}: no 'target' (the parameters) in it")
    directory = file.rsplit("/", 1)[0]
    out = {}
    for name, value in _flatten(optimizer["target"]).items():
        out[name] = _read_tensorstore(value, directory, name) if isinstance(value, Mapping) else np.asarray(value)
    return out


def _t5x_name(cairn_name: str) -> str:
    """The t5x name of a Cairn parameter."""
    parts = cairn_name.split("/")
    if parts[-1] in ("scale", "embedding", "rel_embedding"):
        return cairn_name
    if parts[-1] == "logits":
        return "/".join(parts[:-1] + ["logits_dense", "kernel"])
    return cairn_name + "/kernel"


def convert(t5x_params: Mapping[str, np.ndarray], abstract: Any) -> Any:
    """t5x parameters (`read_params`) as the Cairn parameter tree of `abstract` (a pytree of
    arrays or `jax.ShapeDtypeStruct`s, e.g. `jax.eval_shape(model.init, key)`), in its dtypes.
    A tensor missing, left over, or of another size is a `T5xCheckpointError` naming it."""
    from flax.traverse_util import flatten_dict, unflatten_dict

    wanted = flatten_dict(abstract, sep="/")
    used: set[str] = set()

    def fetch(name: str, shape: tuple[int, ...]) -> np.ndarray:
        t5x = _t5x_name(name)
        if t5x not in t5x_params:
            raise T5xCheckpointError(f"t5x checkpoint has no {t5x!r} (for the model's {name!r})")
        value = t5x_params[t5x]
        if int(np.prod(value.shape)) != int(np.prod(shape)):
            raise T5xCheckpointError(
                f"t5x checkpoint: {t5x!r} has shape {tuple(value.shape)}, the model's {name!r} "
                f"needs {tuple(shape)} (another preset or vocabulary size?)"
            )
        used.add(t5x)
        return np.reshape(value, shape)

    out = {}
    for name, leaf in wanted.items():
        parts = name.split("/")
        if "layers" in parts:  # scanned: stack layers_0..n-1 on the leading axis
            i = parts.index("layers")
            n = leaf.shape[0]
            stacked = [fetch("/".join(parts[:i] + [f"layers_{j}"] + parts[i + 1 :]), leaf.shape[1:]) for j in range(n)]
            value = np.stack(stacked)
        else:
            value = fetch(name, tuple(leaf.shape))
        out[name] = value.astype(leaf.dtype)
    extra = sorted(set(t5x_params) - used)
    if extra:
        raise T5xCheckpointError(
            f"t5x checkpoint has {len(extra)} parameter(s) the model does not, e.g. {extra[0]!r} "
            f"(more layers than the preset, or another architecture?)"
        )
    return unflatten_dict(out, sep="/")


def _t5x_layout(params: Any) -> dict[str, np.ndarray]:
    """Cairn parameters (scanned layers unstacked) under t5x names and `DenseGeneral` shapes."""
    from flax.traverse_util import flatten_dict

    out: dict[str, np.ndarray] = {}
    for name, value in flatten_dict(params, sep="/").items():
        value = np.asarray(value)
        parts = name.split("/")
        layers = [(f"layers_{j}", value[j]) for j in range(value.shape[0])] if "layers" in parts else [("", value)]
        for layer, v in layers:
            names = [layer if p == "layers" and layer else p for p in parts]
            if names[-1] in ("query", "key", "value"):
                v = v.reshape(v.shape[0], -1)
            elif names[-1] == "out":
                v = v.reshape(-1, v.shape[-1])
            out[_t5x_name("/".join(names))] = v
    return out


def export_t5x(params: Any, folder: str, step: int = 0) -> str:
    """Writes `params` as the t5x checkpoint folder `folder` (usually `<run>/checkpoint_<step>`):
    its `checkpoint` msgpack and a gzip zarr TensorStore array per parameter of 2 or more
    dimensions. Returns the `checkpoint` file's path."""
    import tensorstore as ts
    from flax import serialization
    from flax.traverse_util import unflatten_dict

    storage.path(folder).mkdir(parents=True, exist_ok=True)
    target: dict[str, Any] = {}
    for name, value in _t5x_layout(params).items():
        if value.ndim < 2:
            target[name] = value
            continue
        dotted = "target." + name.replace("/", ".")
        metadata = {"compressor": {"id": "gzip"}, "shape": list(value.shape), "chunks": list(value.shape)}
        spec = {"driver": "zarr", "dtype": value.dtype.name, "kvstore": {"driver": "file", "path": dotted}}
        full = dict(spec, metadata=metadata, kvstore={"driver": "file", "path": f"{folder.rstrip('/')}/{dotted}"})
        ts.open(full, create=True, delete_existing=True).result().write(value).result()
        target[name] = dict(spec, metadata=metadata)
    state = {"step": np.int64(step), "param_states": {}}
    contents = {"version": 3, "optimizer": {"target": unflatten_dict(target, sep="/"), "state": state}}
    file = f"{folder.rstrip('/')}/checkpoint"
    storage.write_bytes(file, serialization.msgpack_serialize(contents))
    return file


def import_t5x(path: str, abstract: Any, step: int | None = None) -> Any:
    """`convert(read_params(path, step), abstract)`: a t5x checkpoint as Cairn parameters."""
    return convert(read_params(path, step), abstract)
