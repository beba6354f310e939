"""The Pallas attention kernels (`cairn.models.pallas_attention`, run by Pallas's interpreter on
CPU) equal XLA's attention, forward and gradients (q, k, v and T5's bias), at every real query:
splash for Llama (causal, grouped-query heads, packed segments), flash for the T5 families
(a prefix LM's per-row bias with packing and padding; the T5 network test covers a position
bias shared by the batch); the dispatcher's choice; a sharded mesh; and whole tiny models with
`attention_implementation="pallas"` against "xla" (T5: encoder, causal decoder and
cross-attention through the kernel)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cairn.models import pallas_attention as pa
from cairn.models.attention import NEG_INF

TOL = dict(rtol=2e-5, atol=2e-5)


def _reference(q, k, v, mask, bias=None, scale=1.0):
    """XLA attention, token-major `[b, l, h, d]`, grouped heads; `mask` `[b, q, k]` bool."""
    b, lq, h, d = q.shape
    kvh = k.shape[2]
    qg = q.reshape(b, lq, kvh, h // kvh, d)
    logits = jnp.einsum("bqkgd,bskd->bkgqs", qg, k).astype(jnp.float32) * scale
    if bias is not None:  # [b|1, h, q, s]
        logits = logits + bias.reshape(bias.shape[0], kvh, h // kvh, lq, -1)
    logits = logits + jnp.where(mask, 0.0, NEG_INF)[:, None, None]
    w = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bkgqs,bskd->bqkgd", w, v).reshape(b, lq, h, d)


def _segment_mask(qs, ks):
    """With numpy (a constant of the programs that use it: nothing compiled op by op)."""
    qs, ks = np.asarray(qs), np.asarray(ks)
    return (qs[:, :, None] == ks[:, None, :]) & (qs[:, :, None] > 0) & (ks[:, None, :] > 0)


def _causal(lq, lk):
    return np.arange(lk)[None, :] <= np.arange(lq)[:, None]


def _value_and_grads(fn, args, real):
    """The output and the gradients (every argument) of a fixed random projection of it at
    real queries, in one compiled function."""
    shape = jax.eval_shape(fn, *args).shape
    proj = jnp.asarray(np.random.default_rng(9).standard_normal(shape), jnp.float32) * real[:, :, None, None]

    def both(*a):
        out, pullback = jax.vjp(fn, *a)
        return out, pullback(proj)

    return jax.jit(both)(*args)


def _assert_close(got, want, real):
    out_g, grads_g = got
    out_w, grads_w = want
    sel = np.asarray(real, bool)
    np.testing.assert_allclose(np.asarray(out_g)[sel], np.asarray(out_w)[sel], **TOL)
    for g, w in zip(grads_g, grads_w):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **TOL)


def _normal(seed, shape, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, jnp.float32)


def test_splash_causal_grouped_heads_packed_segments_match_xla():
    b, length, h, kvh, d = 2, 256, 4, 2, 32
    q, k, v = _normal(0, (b, length, h, d)), _normal(1, (b, length, kvh, d)), _normal(2, (b, length, kvh, d))
    # Row 0: three packed segments and padding; row 1: one segment filling the row.
    seg = np.zeros((b, length), np.int32)
    seg[0, :100], seg[0, 100:150], seg[0, 150:230] = 1, 2, 3
    seg[1, :] = 1
    seg = jnp.asarray(seg)
    real = seg > 0
    scale = d**-0.5
    mask = _segment_mask(seg, seg) & _causal(length, length)
    with pa.block_sizes(q=128, kv=128, q_bwd=128, kv_bwd=128):  # several blocks along each axis
        got = _value_and_grads(
            lambda q, k, v: pa.splash_attention(q, k, v, seg, causal=True, scale=scale), (q, k, v), real
        )
    want = _value_and_grads(lambda q, k, v: _reference(q, k, v, mask, scale=scale), (q, k, v), real)
    _assert_close(got, want, real)


FLASH_CASES = {
    # T5's encoder (a position bias shared by the batch, never broadcast to it; padding) runs
    # the same code: its case costs ~2.5 s CPU, so the tiny T5 network below covers it.
    # A decoder-only prefix LM: the prefix block joins the bias, per row; packed rows.
    "prefix_lm": dict(lq=256, lk=256, bias="per_row", causal=False, packed=True),
}


@pytest.mark.parametrize("case", sorted(FLASH_CASES))
def test_flash_with_bias_and_segments_matches_xla(case):
    c = FLASH_CASES[case]
    b, h, d, lq, lk = 2, 2, 32, c["lq"], c["lk"]
    q, k, v = _normal(3, (b, lq, h, d)), _normal(4, (b, lk, h, d)), _normal(5, (b, lk, h, d))
    qs = np.ones((b, lq), np.int32)
    ks = np.ones((b, lk), np.int32)
    ks[0, lk - 40 :] = 0  # padded keys
    if c["packed"]:
        qs[1, lq // 2 :] = 2
        ks[1, lk // 2 :] = 2
        qs[0, lq - 20 :] = 0
    qs, ks = jnp.asarray(qs), jnp.asarray(ks)
    real = qs > 0
    mask = _segment_mask(qs, ks)
    bias = None
    if c["bias"] == "per_row":
        prefix = np.arange(lq)[None, :] < np.array([[40], [90]])
        visible = _causal(lq, lk)[None] | (prefix[:, :, None] & prefix[:, None, :])
        bias = _normal(6, (1, h, lq, lk)) + np.where(visible, 0.0, NEG_INF).astype(np.float32)[:, None]
    if c["causal"]:
        mask = mask & _causal(lq, lk)
    args = (q, k, v) if bias is None else (q, k, v, bias)

    def kernel(q, k, v, bias=None):
        return pa.flash_attention(q, k, v, bias, qs, ks, causal=c["causal"])

    def xla(q, k, v, bias=None):
        return _reference(q, k, v, mask, bias)

    with pa.block_sizes(q=128, kv=128, q_bwd=128, kv_bwd=128):
        got = _value_and_grads(kernel, args, real)
    want = _value_and_grads(xla, args, real)
    _assert_close(got, want, real)


def test_dispatch_chooses_xla_on_cpu_and_pallas_names_what_it_cannot_run(monkeypatch):
    assert not pa.on_tpu()
    assert pa.use_kernel(None, 256, 256, 64) is False  # automatic: XLA off the TPU
    assert pa.use_kernel("xla", 256, 256, 64) is False
    assert pa.use_kernel("cudnn", 256, 256, 64) is False
    assert pa.use_kernel("pallas", 256, 256, 64) is True
    with pytest.raises(ValueError, match="multiples of 128"):
        pa.use_kernel("pallas", 114, 512, 64)  # T5.1.1's 114-token targets
    with pytest.raises(ValueError, match="head_dim 192"):
        pa.use_kernel("pallas", 256, 256, 192)
    with pytest.raises(ValueError, match="prefix"):
        pa.use_kernel("pallas", 256, 256, 64, "a prefix LM's mask")
    assert pa.use_kernel(None, 256, 256, 64, "a prefix LM's mask") is False
    assert [pa.block_size(n, 512) for n in (128, 384, 512, 640, 2048)] == [128, 384, 512, 128, 512]
    with pytest.raises(ValueError, match="multiple of 128"):
        pa.block_size(114, 512)
    with pytest.raises(ValueError, match="multiple of 128"):
        with pa.block_sizes(q=100):
            pass
    assert pa.BLOCK_Q == 512
    # On a TPU the automatic choice takes the kernel where supported, and the bias kernel only
    # from `auto_min_length` (T5's 512 tokens stay on XLA, measured faster there).
    monkeypatch.setattr(pa, "on_tpu", lambda: True)
    assert pa.use_kernel(None, 2048, 2048, 64) is True
    assert pa.use_kernel(None, 512, 512, 64, None, pa.FLASH_AUTO_MIN_LENGTH) is False
    assert pa.use_kernel(None, 1024, 1024, 64, None, pa.FLASH_AUTO_MIN_LENGTH) is True
    assert pa.use_kernel("pallas", 512, 512, 64, None, pa.FLASH_AUTO_MIN_LENGTH) is True
    assert pa.use_kernel(None, 114, 512, 64) is False


def test_configs_validate_attention_implementation():
    from cairn.models import DecoderOnlyConfig, LlamaConfig, T5Config

    for cls in (T5Config, DecoderOnlyConfig, LlamaConfig):
        assert cls(attention_implementation="pallas").attention_implementation == "pallas"
        assert cls(attention_implementation="cudnn").attention_implementation == "cudnn"
        with pytest.raises(ValueError, match="attention_implementation must be one of"):
            cls(attention_implementation="flash")


def test_splash_under_a_sharded_mesh_runs_per_shard_and_matches():
    from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules

    if jax.device_count() < 4:
        pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    mesh = create_mesh({"data": 2, "fsdp": 1, "model": 2}, devices=jax.devices()[:4])
    partitioner = Partitioner(mesh, standard_logical_axis_rules())
    b, length, h, kvh, d = 2, 128, 4, 2, 32
    q, k, v = _normal(0, (b, length, h, d)), _normal(1, (b, length, kvh, d)), _normal(2, (b, length, kvh, d))
    seg = jnp.asarray(np.repeat([[1] * 60 + [2] * 68], b, 0), jnp.int32)

    def fn(q, k, v):
        return pa.splash_attention(q, k, v, seg, causal=True, scale=0.25)

    step = partitioner.partition(fn)
    with jax.set_mesh(mesh), partitioner.activated():
        text = str(jax.make_jaxpr(fn)(q, k, v))
    assert "shard_map" in text
    got = step(q, k, v)
    mask = _segment_mask(seg, seg) & _causal(length, length)
    want = jax.jit(lambda q, k, v: _reference(q, k, v, mask, scale=0.25))(q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TOL)


def _assert_models_equal(make, config, tiny, inputs, real):
    """`make(config)`'s network with attention_implementation "pallas" and "xla": equal logits
    at real positions and equal gradients of a random projection of them (float32 sums in
    another order: gradients compared by norm)."""
    xla = make(config.replace(attention_implementation="xla"))
    pallas = make(config.replace(attention_implementation="pallas"))
    params = tiny.random_params(xla, std=0.3)
    proj = tiny.projection(xla, params, inputs, real)
    want = tiny.projected_run(xla, params, inputs, proj)
    tiny.assert_runs_agree(tiny.projected_run(pallas, params, inputs, proj), want, real)


def test_tiny_llama_with_pallas_equals_xla(tiny):
    """Packed rows with padding, grouped-query heads: the splash kernel in the network."""
    from cairn.models import DecoderOnlyModel, LlamaConfig

    config = LlamaConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=48, num_layers=1)
    seg = np.array([[1] * 50 + [2] * 60 + [0] * 18, [1] * 128], np.int32)
    tokens = tiny.random_tokens(1, (2, 128), 64) * (seg > 0)
    _assert_models_equal(DecoderOnlyModel, config, tiny, (tokens, seg), jnp.asarray(seg > 0))


def test_tiny_t5_with_pallas_equals_xla(tiny):
    """Encoder (padded inputs), causal decoder and cross-attention all through the flash kernel."""
    from cairn.models import EncoderDecoderModel

    config = tiny.t5_1_1.replace(num_encoder_layers=1, num_decoder_layers=1)
    inputs = tiny.random_tokens(2, (2, 128), 67)
    inputs[0, 100:] = 0  # padding: the encoder's segment ids come from the tokens
    targets = tiny.random_tokens(3, (2, 128), 67)
    _assert_models_equal(EncoderDecoderModel, config, tiny, (inputs, targets), jnp.ones((2, 128), bool))
