"""t5x checkpoint import, against checkpoints this test writes in t5x's documented layout
(t5x/checkpoints.py): a flax-msgpack `checkpoint` file `{"version": 3, "optimizer": {"target",
"state"}}` where partitioned parameters are TensorStore zarr specs (gzip chunks, `kvstore` path
relative to the checkpoint folder, written here with TensorStore as t5x does) and the others
arrays inline; t5x's names (`.../kernel`, `logits_dense`) and `DenseGeneral`'s flattened
attention kernels. Not checked against t5x itself (it is not installable here)."""

import functools

import jax
import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
from flax import serialization
from flax.traverse_util import flatten_dict, unflatten_dict

from cairn.models import EncoderDecoderModel, get_preset
from cairn.models.t5x_checkpoint import T5xCheckpointError, import_t5x, read_params

CONFIG = get_preset("t5_1_1_tiny", vocab_size=384)
BATCH = {
    "encoder_input_tokens": np.array([[5, 9, 33, 1, 0]], np.int32),
    "decoder_input_tokens": np.array([[0, 7, 12]], np.int32),
    "decoder_target_tokens": np.array([[7, 12, 1]], np.int32),
}


def t5x_layout(params) -> dict:
    """Cairn parameters under t5x's names and shapes (what t5x's T5 network stores)."""
    out = {}
    for name, value in flatten_dict(params, sep="/").items():
        parts = name.split("/")
        value = np.asarray(value)
        if parts[-1] in ("query", "key", "value"):  # DenseGeneral: [embed, heads * head_dim]
            value = value.reshape(value.shape[0], -1)
        elif parts[-1] == "out":  # [heads * head_dim, embed]
            value = value.reshape(-1, value.shape[-1])
        if parts[-1] == "logits":
            name = "/".join(parts[:-1] + ["logits_dense", "kernel"])
        elif parts[-1] not in ("scale", "embedding", "rel_embedding"):
            name += "/kernel"
        out[name] = value
    return out


def write_t5x(folder, flat: dict, step: int = 100, bf16=(), version: int = 3) -> None:
    """A t5x checkpoint: kernels and embeddings in TensorStore (partitioned in t5x), norm scales
    inline in the msgpack (unpartitioned); `bf16` names stored as bfloat16."""
    folder.mkdir(parents=True)
    target = {}
    for name, value in flat.items():
        dotted = "target." + name.replace("/", ".")
        if name.endswith("/scale"):
            target[name] = value
            continue
        dtype = "bfloat16" if name in bf16 else "float32"
        chunks = [max(1, d // 2) for d in value.shape]
        metadata = {"compressor": {"id": "gzip"}, "shape": list(value.shape), "chunks": chunks}
        spec = {"driver": "zarr", "dtype": dtype, "kvstore": {"driver": "file", "path": dotted}, "metadata": metadata}
        absolute = {**spec, "kvstore": {"driver": "file", "path": str(folder / dotted)}}
        store = ts.open(absolute, create=True, open=True).result()
        store.write(value.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)).result()
        target[name] = spec  # relative to the checkpoint folder, as t5x writes it
    optimizer = {
        "target": unflatten_dict(target, sep="/"),
        "state": {"step": np.int32(step), "param_states": {"token_embedder": {"embedding": {"v_row": np.zeros(4)}}}},
    }
    contents = {"version": version, "optimizer": optimizer} if version else optimizer
    (folder / "checkpoint").write_bytes(serialization.msgpack_serialize(contents))


@pytest.fixture(scope="module")
def trained(tiny):
    """The model and parameters of its init's tree: random values drawn with numpy (an import
    must reproduce any values; a jitted init's random-number program costs seconds to compile),
    normal(0, 0.05), below the init's scale, so that the bfloat16 embedding moves the logits as
    little as it does at the init."""
    model = EncoderDecoderModel(CONFIG)
    return model, tiny.random_params(model, seed=3, std=0.05)


@functools.lru_cache
def _apply(model):
    return jax.jit(model.apply)


def test_a_t5x_checkpoint_imports_exactly(tmp_path, trained):
    model, params = trained
    write_t5x(tmp_path / "run" / "checkpoint_100", t5x_layout(params))
    flat = read_params(str(tmp_path / "run"))  # the run folder: its latest checkpoint_<step>
    assert flat["encoder/layers_0/attention/query/kernel"].shape == (128, 128)
    got = import_t5x(str(tmp_path / "run"), jax.eval_shape(model.init, jax.random.PRNGKey(0)))
    want = flatten_dict(params, sep="/")
    for name, value in flatten_dict(got, sep="/").items():
        np.testing.assert_array_equal(value, np.asarray(want[name]), err_msg=name)
    np.testing.assert_array_equal(_apply(model)(got, BATCH), _apply(model)(params, BATCH))


def test_into_a_scanned_model_and_from_version_0_and_bfloat16(tmp_path, trained):
    model, params = trained
    flat = t5x_layout(params)
    write_t5x(tmp_path / "checkpoint_7", flat, step=7, bf16=("token_embedder/embedding",), version=0)
    scanned = EncoderDecoderModel(CONFIG.replace(scan_layers=True))
    got = import_t5x(str(tmp_path / "checkpoint_7"), jax.eval_shape(scanned.init, jax.random.PRNGKey(0)))
    q = flatten_dict(got, sep="/")["encoder/layers/attention/query"]
    assert q.shape == (CONFIG.num_encoder_layers, 128, 4, 32)
    np.testing.assert_array_equal(q[1], np.asarray(params["encoder"]["layers_1"]["attention"]["query"]))
    emb = flatten_dict(got, sep="/")["token_embedder/embedding"]
    assert emb.dtype == np.float32
    np.testing.assert_array_equal(emb, np.asarray(params["token_embedder"]["embedding"]).astype(ml_dtypes.bfloat16))
    unscanned_logits = _apply(model)(params, BATCH)
    np.testing.assert_allclose(_apply(scanned)(got, BATCH), unscanned_logits, atol=0.05)  # bf16 embedding


def test_bad_checkpoints_are_named(tmp_path, trained):
    model, params = trained
    abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    flat = t5x_layout(params)
    with pytest.raises(T5xCheckpointError, match="no such file or folder"):
        import_t5x(str(tmp_path / "absent"), abstract)
    missing = dict(flat)
    del missing["decoder/layers_1/mlp/wo/kernel"]
    write_t5x(tmp_path / "a", missing)
    with pytest.raises(T5xCheckpointError, match="no 'decoder/layers_1/mlp/wo/kernel'"):
        import_t5x(str(tmp_path / "a"), abstract)
    write_t5x(tmp_path / "b", flat)
    wider = EncoderDecoderModel(CONFIG.replace(mlp_dim=512))
    with pytest.raises(T5xCheckpointError, match=r"'(en|de)coder/layers_0/mlp/wi_0/kernel' has shape \(128, 256\)"):
        import_t5x(str(tmp_path / "b"), jax.eval_shape(wider.init, jax.random.PRNGKey(0)))
    fewer = EncoderDecoderModel(CONFIG.replace(num_decoder_layers=1))
    with pytest.raises(T5xCheckpointError, match="parameter.s. the model does not, e.g. 'decoder/layers_1/"):
        import_t5x(str(tmp_path / "b"), jax.eval_shape(fewer.init, jax.random.PRNGKey(0)))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "checkpoint").write_bytes(b"not msgpack \xc1")
    with pytest.raises(T5xCheckpointError, match="not a msgpack checkpoint"):
        read_params(str(tmp_path / "c"))
    with pytest.raises(T5xCheckpointError, match=r"no step 5 \(steps: \[100\]\)"):
        write_t5x(tmp_path / "d" / "checkpoint_100", flat)
        read_params(str(tmp_path / "d"), step=5)


def test_export_then_import_is_exact_and_matches_the_t5x_layout(tmp_path, trained):
    from cairn.models.t5x_checkpoint import export_t5x

    model, params = trained
    scanned = EncoderDecoderModel(CONFIG.replace(scan_layers=True))
    stacked = import_t5x(
        str(_written(tmp_path / "fixture", params)), jax.eval_shape(scanned.init, jax.random.PRNGKey(0))
    )
    export_t5x(stacked, str(tmp_path / "run" / "checkpoint_9"), step=9)  # from the scanned model
    assert read_params(str(tmp_path / "run")).keys() == t5x_layout(params).keys()
    for name, value in read_params(str(tmp_path / "run")).items():
        np.testing.assert_array_equal(value, t5x_layout(params)[name], err_msg=name)
    back = import_t5x(str(tmp_path / "run"), jax.eval_shape(model.init, jax.random.PRNGKey(0)))
    jax.tree.map(np.testing.assert_array_equal, back, jax.tree.map(np.asarray, params))


def _written(folder, params):
    write_t5x(folder, t5x_layout(params))
    return folder
