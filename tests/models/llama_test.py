"""The Llama network: parameter tree, parity with transformers' LlamaForCausalLM (GQA, MQA, llama3
RoPE scaling, tied and untied), packed rows, prefix LM, and the decode-cache contract."""

import functools

import jax
import numpy as np
import pytest
import torch
import transformers
from flax.traverse_util import flatten_dict

from cairn.models import DecodeOptions, DecoderOnlyModel, LlamaConfig, get_family, get_preset
from cairn.models.llama.rope import inverse_frequencies

SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
TINY = LlamaConfig(
    vocab_size=97, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=48, num_layers=2, init_std=0.2
)


_HELPERS = {}


@pytest.fixture(scope="module", autouse=True)
def _helpers(tiny):
    """conftest's helpers for `_model` (test modules cannot import conftest)."""
    _HELPERS["random_params"] = tiny.random_params


@functools.lru_cache
def _model(**changes):
    """A model and random parameters of its init's tree (normal(0, init_std), norm scales 1:
    nothing compiled), built once per configuration for the whole module."""
    model = DecoderOnlyModel(TINY.replace(**changes))
    return model, _HELPERS["random_params"](model, std=TINY.init_std)


@functools.lru_cache
def _apply(model):
    """One jitted forward pass per model, shared by the tests."""
    return jax.jit(model.apply)


def _shapes(**changes):
    """The parameter tree's shapes and dtypes, without running the initialiser."""
    model = DecoderOnlyModel(TINY.replace(**changes))
    return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0)))


def test_parameter_tree_names_and_shapes():
    params = _shapes(tie_word_embeddings=False)
    shapes = {"/".join(k): v.shape for k, v in flatten_dict(params).items()}
    layer = {
        "pre_attention_norm/scale": (32,),
        "attention/query/kernel": (32, 4, 16),
        "attention/key/kernel": (32, 2, 16),
        "attention/value/kernel": (32, 2, 16),
        "attention/out/kernel": (4, 16, 32),
        "pre_mlp_norm/scale": (32,),
        "mlp/wi_0/kernel": (32, 48),
        "mlp/wi_1/kernel": (32, 48),
        "mlp/wo/kernel": (48, 32),
    }
    want = {"token_embedder/embedding": (97, 32), "decoder_norm/scale": (32,), "logits/kernel": (32, 97)}
    want.update({f"layers_{i}/{k}": v for i in range(2) for k, v in layer.items()})
    assert shapes == want
    tied = _shapes(scan_layers=True)
    shapes = {"/".join(k): v.shape for k, v in flatten_dict(tied).items()}
    assert "logits/kernel" not in shapes
    assert shapes["layers/attention/key/kernel"] == (2, 32, 2, 16)
    axes = DecoderOnlyModel(TINY.replace(scan_layers=True)).logical_axes()
    assert tuple(axes["layers"]["attention"]["key"]["kernel"]) == ("layers", "embed", "heads", "kv")
    assert tuple(axes["token_embedder"]["embedding"]) == ("vocab", "embed")


def _hf_config(c: LlamaConfig):
    rope = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling:
        rope = {**c.rope_scaling_dict, "rope_theta": c.rope_theta}
    return transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.emb_dim,
        intermediate_size=c.mlp_dim,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings,
        max_position_embeddings=256,
        rope_parameters=rope,
    )


def _from_hf(state, c: LlamaConfig):
    """transformers' state dict -> our parameter tree (torch `Linear` weights are `[out, in]`)."""
    sd = {k: v.detach().numpy() for k, v in state.items()}
    e, h, kv, d = c.emb_dim, c.num_heads, c.num_kv_heads, c.head_dim
    params = {"token_embedder": {"embedding": sd["model.embed_tokens.weight"]}}
    params["decoder_norm"] = {"scale": sd["model.norm.weight"]}
    if not c.tie_word_embeddings:
        params["logits"] = {"kernel": sd["lm_head.weight"].T}
    for i in range(c.num_layers):
        w = lambda name, i=i: sd[f"model.layers.{i}.{name}.weight"]
        params[f"layers_{i}"] = {
            "pre_attention_norm": {"scale": w("input_layernorm")},
            "pre_mlp_norm": {"scale": w("post_attention_layernorm")},
            "attention": {
                "query": {"kernel": w("self_attn.q_proj").T.reshape(e, h, d)},
                "key": {"kernel": w("self_attn.k_proj").T.reshape(e, kv, d)},
                "value": {"kernel": w("self_attn.v_proj").T.reshape(e, kv, d)},
                "out": {"kernel": w("self_attn.o_proj").T.reshape(h, d, e)},
            },
            "mlp": {
                "wi_0": {"kernel": w("mlp.gate_proj").T},
                "wi_1": {"kernel": w("mlp.up_proj").T},
                "wo": {"kernel": w("mlp.down_proj").T},
            },
        }
    return params


@pytest.mark.parametrize(
    "changes",
    [
        dict(rope_theta=10000.0, rope_scaling=SCALING, tie_word_embeddings=False),  # GQA, all three llama3 bands
        dict(num_kv_heads=1, rope_theta=500000.0),  # multi-query, tied
        dict(num_kv_heads=4, tie_word_embeddings=False),  # plain multi-head
    ],
)
def test_logits_match_transformers_llama(changes):
    c = TINY.replace(**changes)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(_hf_config(c)).eval()
    with torch.no_grad():  # random norm scales and larger weights than the default init
        for name, p in hf.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "norm" not in name else 1.0))
    tokens = np.random.default_rng(0).integers(1, c.vocab_size, (2, 80)).astype(np.int32)
    with torch.no_grad():
        want = hf(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    got = np.asarray(jax.jit(DecoderOnlyModel(c).apply)(_from_hf(hf.state_dict(), c), {"decoder_input_tokens": tokens}))
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)


def test_llama3_inverse_frequencies_match_transformers():
    c = get_preset("llama_1b")
    hf = transformers.LlamaConfig(
        hidden_size=c.emb_dim,
        num_attention_heads=c.num_heads,
        head_dim=c.head_dim,
        rope_parameters={**c.rope_scaling_dict, "rope_theta": c.rope_theta},
    )
    want, factor = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    got = inverse_frequencies(c.head_dim, c.rope_theta, dict(c.rope_scaling))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
    assert factor == 1.0
    plain = inverse_frequencies(c.head_dim, c.rope_theta)
    assert (got <= plain).all() and (got < plain).any() and got[0] == plain[0]


@pytest.mark.parametrize("scan", [False, True])
def test_packed_row_equals_each_segment_alone(scan):
    """One batch (one compiled program): row 0 packs segments a and b; rows 1 and 2 hold a and b
    alone (right-padded: causal, so the padding is never attended); row 3 is row 0 with a single
    segment id, so b would see a: the segment mask matters."""
    model, params = _model(scan_layers=scan)
    rng = np.random.default_rng(1)
    a, b = rng.integers(2, 97, 5).astype(np.int32), rng.integers(2, 97, 7).astype(np.int32)
    row = np.concatenate([a, b, [0, 0, 0, 0]])
    batch = {
        "decoder_input_tokens": np.stack([row, np.pad(a, (0, 11)), np.pad(b, (0, 9)), row]),
        "decoder_segment_ids": np.array(
            [[1] * 5 + [2] * 7 + [0] * 4, [1] * 5 + [0] * 11, [1] * 7 + [0] * 9, [1] * 12 + [0] * 4], np.int32
        ),
        "decoder_positions": np.array(
            [list(range(5)) + list(range(7)) + [0] * 4, list(range(16)), list(range(16)), list(range(16))], np.int32
        ),
    }
    got, alone_a, alone_b, leaky = np.asarray(_apply(model)(params, batch))
    np.testing.assert_allclose(got[:5], alone_a[:5], atol=1e-5)
    np.testing.assert_allclose(got[5:12], alone_b[:7], atol=1e-5)
    # Without the segment boundary the second segment would see the first: the mask matters.
    assert not np.allclose(leaky[5:12], alone_b[:7], atol=1e-3)


def test_prefix_lm_attends_bidirectionally_over_inputs():
    model, params = _model()
    apply = _apply(model)
    tokens = np.random.default_rng(2).integers(2, 97, (1, 8)).astype(np.int32)
    prefix = {"decoder_input_tokens": tokens, "decoder_causal_attention": np.array([[1] * 4 + [0] * 4], np.int32)}
    causal = np.asarray(apply(params, {"decoder_input_tokens": tokens}))
    with_prefix = np.asarray(apply(params, prefix))
    assert not np.allclose(with_prefix[0, 0], causal[0, 0])  # position 0 sees the prefix
    later = dict(prefix, decoder_input_tokens=tokens.copy())
    later["decoder_input_tokens"][0, 6] = 5  # a target position stays invisible to earlier ones
    np.testing.assert_allclose(np.asarray(apply(params, later))[0, :6], with_prefix[0, :6], atol=1e-6)


def _empty_cache(model, params, rows, max_len):
    def make():
        _, mutated = model.module.apply(
            {"params": params}, np.zeros((rows, max_len), np.int32), decode=True, mutable=["cache"]
        )
        return mutated["cache"]

    return jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(make))


@functools.lru_cache
def _step_fn(model):
    @jax.jit
    def step(params, cache, tokens, segment_ids, positions):
        logits, mutated = model.module.apply(
            {"params": params, "cache": cache},
            tokens,
            segment_ids,
            decode=True,
            decoder_positions=positions,
            mutable=["cache"],
        )
        return logits, mutated["cache"]

    return step


@pytest.mark.parametrize("scan", [False, True])
def test_decoding_in_chunks_equals_the_full_forward_pass(scan):
    """Single steps from an empty cache, a prefill of 6 then single steps, and chunks of 3 (three
    chunk sizes: three compiled steps) give the full forward's logits; the cache index and
    shapes are as documented."""
    model, params = _model(scan_layers=scan, remat_policy="full")
    tokens = np.random.default_rng(3).integers(2, 97, (2, 10)).astype(np.int32)
    want = np.asarray(_apply(model)(params, {"decoder_input_tokens": tokens}))
    step = _step_fn(model)
    for chunks in [(1,) * 10, (6, 1, 1, 1, 1), (3, 3, 3, 1)]:
        cache, got, i = _empty_cache(model, params, 2, 12), [], 0
        for n in chunks:
            logits, cache = step(params, cache, tokens[:, i : i + n], None, None)
            got.append(np.asarray(logits))
            i += n
        np.testing.assert_allclose(np.concatenate(got, axis=1), want, atol=1e-5, err_msg=str(chunks))
        index = cache["layers"]["attention"]["cache_index"] if scan else cache["layers_0"]["attention"]["cache_index"]
        assert np.all(np.asarray(index) == 10)
        layer = cache["layers"]["attention"] if scan else cache["layers_1"]["attention"]
        assert layer["cached_key"].shape[-3:] == (12, 2, 16) and layer["cached_key_mask"].shape[-2:] == (2, 12)


def test_a_flat_decode_cache_decodes_as_the_four_dimensional_one(monkeypatch):
    """The flat cache `[b, max_len, kv_heads * head_dim]` (TPU's: `flat_cache`; forced here on
    the CPU) gives the full forward's logits for a prefill and single steps, and
    `attend_flat_step` equals `jax.nn.dot_product_attention` over the unflattened cache."""
    import jax.numpy as jnp

    from cairn.models.llama import attention

    monkeypatch.setattr(attention, "FLAT_CACHE_PLATFORMS", ("cpu",))
    model, params = _model()
    tokens = np.random.default_rng(3).integers(2, 97, (2, 10)).astype(np.int32)
    want = np.asarray(_apply(model)(params, {"decoder_input_tokens": tokens}))
    step = jax.jit(_step_fn(model).__wrapped__)  # traced afresh with the flat cache
    cache, got, i = _empty_cache(model, params, 2, 12), [], 0
    assert cache["layers_0"]["attention"]["cached_key"].shape == (2, 12, 2 * 16)
    for n in (6, 1, 1, 1, 1):
        logits, cache = step(params, cache, tokens[:, i : i + n], None, None)
        got.append(np.asarray(logits))
        i += n
    np.testing.assert_allclose(np.concatenate(got, axis=1), want, atol=1e-5)

    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(3, 1, 8, 16), (3, 7, 2, 16), (3, 7, 2, 16)])
    mask = jnp.asarray(rng.random((3, 1, 1, 7)) < 0.6).at[..., 0].set(True)
    flat = attention.attend_flat_step(q, k.reshape(3, 7, 32), v.reshape(3, 7, 32), mask, scale=0.25)
    np.testing.assert_allclose(
        flat, jax.nn.dot_product_attention(q, k, v, mask=mask, scale=0.25, implementation="xla"), atol=1e-6
    )
    with pytest.raises(ValueError, match="is not one step of the flat cache"):
        attention.attend_flat_step(jnp.zeros((3, 2, 8, 16)), k.reshape(3, 7, 32), v.reshape(3, 7, 32), mask, scale=1.0)


def test_a_left_padded_prompt_decodes_like_the_unpadded_one():
    """Padding keys (segment id 0) are never attended; positions given explicitly."""
    model, params = _model()
    real = np.random.default_rng(4).integers(2, 97, (1, 7)).astype(np.int32)
    want = np.asarray(_apply(model)(params, {"decoder_input_tokens": real}))[0]
    pad = 3
    prompt = np.concatenate([np.zeros((1, pad), np.int32), real[:, :4]], axis=1)
    segments = np.array([[0] * pad + [1] * 4], np.int32)
    positions = np.array([[0] * pad + list(range(4))], np.int32)
    cache, step = _empty_cache(model, params, 1, 12), _step_fn(model)
    logits, cache = step(params, cache, prompt, segments, positions)
    got = [np.asarray(logits)[0, pad:]]
    for j in range(4, 7):
        logits, cache = step(params, cache, real[:, j : j + 1], None, np.array([[j]], np.int32))
        got.append(np.asarray(logits)[0])
    np.testing.assert_allclose(np.concatenate(got), want, atol=1e-5)
    assert np.asarray(cache["layers_0"]["attention"]["cached_key_mask"])[0].tolist() == [0] * 3 + [1] * 7 + [0] * 2


def test_predict_batch_with_cache_equals_without_and_keeps_the_prompt():
    family = get_family("llama")
    model = family.make_model(TINY.replace(scan_layers=True))
    params = _HELPERS["random_params"](model, std=TINY.init_std)
    prompts = np.zeros((2, 4), np.int32)
    prompts[0, :3] = [5, 6, 7]
    prompts[1, :1] = 9

    def predict(**options):
        fn = jax.jit(functools.partial(model.predict_batch, options=DecodeOptions(max_decode_length=9, **options)))
        return [np.asarray(x) for x in fn(params, family.decode_batch(prompts))]

    (cached, s1), (plain, s2) = predict(), predict(use_cache=False)
    np.testing.assert_array_equal(cached, plain)
    np.testing.assert_allclose(s1, s2, rtol=1e-5)
    assert cached[0, :3].tolist() == [5, 6, 7] and cached[1, 0] == 9


def test_param_dtype_stores_parameters_and_dtype_computes():
    """Abstract evaluation (dtypes only, nothing compiled)."""
    model = DecoderOnlyModel(TINY.replace(param_dtype="bfloat16", dtype="bfloat16"))
    params = _shapes(param_dtype="bfloat16", dtype="bfloat16")
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(params)} == {"bfloat16"}
    logits = jax.eval_shape(model.apply, params, {"decoder_input_tokens": np.ones((1, 4), np.int32)})
    assert logits.dtype == np.float32


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(num_kv_heads=3), r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"),
        (dict(num_kv_heads=0), r"num_kv_heads must be a positive int"),
        (dict(head_dim=15), "head_dim must be even"),
        (dict(param_dtype="int8"), "param_dtype must be"),
        (dict(rope_theta=0.0), "rope_theta must be a positive number"),
        (dict(rope_scaling={"factor": 8.0}), "rope_scaling needs exactly the keys"),
        (dict(rope_scaling={**SCALING, "rope_type": "yarn"}), "rope_scaling: only rope_type 'llama3'"),
        (dict(rope_scaling={**SCALING, "low_freq_factor": 5.0}), "rope_scaling: need 0 < low_freq_factor"),
        (dict(attention_implementation="flash"), "attention_implementation must be one of"),
        (dict(num_layers=0), "num_layers must be a positive int"),
    ],
)
def test_bad_configs_are_named(changes, message):
    with pytest.raises(ValueError, match=rf"^LlamaConfig\.{message}"):
        TINY.replace(**changes)


def test_rope_scaling_is_stored_hashable_and_given_back_as_transformers_writes_it():
    c = TINY.replace(rope_scaling={**SCALING, "rope_type": "llama3"})
    assert c.rope_scaling == tuple((k, float(v)) for k, v in SCALING.items())
    hash(c)
    assert c.rope_scaling_dict == {"rope_type": "llama3", **SCALING}
    assert c.replace(rope_scaling=c.rope_scaling) == c


def test_the_decode_cache_write_pins_a_head_major_layout_on_tpu(monkeypatch):
    """On TPU `write_cache` pins the cache's layout (a position-minor cache made every step
    rewrite it whole); the values are the slice's. The pin is checked in the lowered program
    (a CPU stands in for the TPU: `default_backend` is patched while tracing)."""
    import jax.numpy as jnp

    from cairn.models.llama import attention

    cache = jnp.arange(2 * 6 * 3 * 4, dtype=jnp.float32).reshape(2, 6, 3, 4)
    chunk = -jnp.ones((2, 1, 3, 4), jnp.float32)
    expected = np.asarray(cache).copy()
    expected[:, 4] = -1
    plain = jax.jit(attention.write_cache).lower(cache, chunk, 4).as_text()
    assert "LayoutConstraint" not in plain
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    pinned = jax.jit(lambda *a: attention.write_cache(*a))  # a new function: traced again
    assert "LayoutConstraint" in pinned.lower(cache, chunk, 4).as_text()
    np.testing.assert_array_equal(np.asarray(pinned(cache, chunk, 4)), expected)


def test_a_cached_call_attends_only_the_written_prefix():
    """`attend_written` reads the smallest `cache_buckets` prefix holding the written positions
    (a `switch` over static prefixes) and equals attention over the whole cache."""
    import jax.numpy as jnp

    from cairn.models.llama.attention import attend_written, cache_buckets

    assert cache_buckets(383, 128) == (128, 256, 383)
    assert cache_buckets(100, 128) == (100,)
    assert cache_buckets(64, 16) == (16, 32, 64)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(2, 1, 4, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, 40, 2, 8)), jnp.float32) for _ in range(2))
    # a prompt position masked out in row 1 (padding), and the positions not yet written
    real = np.ones((2, 40), bool)
    real[1, 2] = False

    def fn(q, k, v, mask, written):
        return attend_written(q, k, v, mask, written, scale=0.35, implementation="xla", smallest=8)

    program = str(jax.make_jaxpr(fn)(q, k, v, jnp.ones((2, 1, 1, 40), bool), 3))
    assert "cond[" in program and all(f"f32[2,{n},2,8]" in program for n in (8, 16, 32))
    attend = jax.jit(fn)
    for written in (1, 8, 9, 17, 33, 40):
        mask = jnp.asarray((np.arange(40) < written)[None, None, None, :] & real[:, None, None, :])
        want = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=0.35, implementation="xla")
        np.testing.assert_allclose(np.asarray(attend(q, k, v, mask, written)), np.asarray(want), rtol=1e-6, atol=1e-6)
