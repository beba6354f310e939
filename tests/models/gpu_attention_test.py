"""cuDNN's fused attention on GPU (`cairn.models.gpu_attention`), without a GPU: the restrictions
it is chosen by (programs built for a GPU through `platform.compile_target("gpu")`), the
automatic choice (cuDNN where supported, XLA with the reason logged once otherwise), "cudnn"
forced where it cannot run (a `ValueError` naming why), the families' wiring (every attention
of Llama, the GPT-style decoder and T5 takes it), and the arguments each family passes: the
same calls with `jax.nn.dot_product_attention`'s "xla" implementation in place of "cudnn" equal
the families' own attention, logits and gradients (grouped-query heads with packing and
padding, a prefix LM's mask, T5's position bias with padded inputs), and the remat policies
keep the kernel's residuals."""

import contextlib
import io
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cairn.models import gpu_attention as ga
from cairn.partitioning import platform

BF16 = jnp.bfloat16
Q, KV = (2, 128, 8, 64), (2, 128, 2, 64)  # grouped-query heads: 8 query, 2 key/value


def test_unsupported_reason_encodes_cudnns_restrictions():
    assert "built for cpu" in ga.unsupported_reason(Q, KV, BF16)
    with platform.compile_target("gpu"):
        assert ga.unsupported_reason(Q, KV, BF16) is None
        assert ga.unsupported_reason(Q, KV, jnp.float16, (1, 8, 128, 128)) is None
        assert ga.unsupported_reason(Q, KV, BF16, (2, 1, 128, 128)) is None
        assert ga.unsupported_reason((2, 127, 8, 64), (2, 127, 2, 64), BF16) is None  # odd, no bias
        assert ga.max_head_dim() == 128  # no Hopper to ask: the smaller limit
        cases = {
            "dtype float32": (Q, KV, jnp.float32, None),
            "head_dim 60 must be a multiple of 8": ((2, 128, 8, 60), (2, 128, 2, 60), BF16, None),
            "head_dim 192 must be a multiple of 8 and at most 128": ((2, 128, 8, 192), (2, 128, 2, 192), BF16, None),
            "not a multiple of key/value heads 3": (Q, (2, 128, 3, 64), BF16, None),
            "bias shape (1, 8, 128, 64)": (Q, KV, BF16, (1, 8, 128, 64)),
            "bias shape (3, 8, 128, 128)": (Q, KV, BF16, (3, 8, 128, 128)),
            "must be even": ((2, 127, 8, 64), (2, 127, 2, 64), BF16, (1, 8, 127, 127)),
        }
        for want, args in cases.items():
            assert want in (ga.unsupported_reason(*args) or ""), want


def test_automatic_choice_takes_cudnn_on_gpu_and_logs_each_refusal_once(monkeypatch, caplog):
    monkeypatch.setattr(ga, "_logged", set())
    caplog.set_level(logging.WARNING, logger=ga.__name__)
    assert ga.fused_implementation(None, Q, KV, BF16) is None  # CPU: XLA, nothing logged
    assert ga.fused_implementation(None, Q, KV, jnp.float32) is None
    assert not caplog.records
    with platform.compile_target("gpu"):
        assert ga.fused_implementation(None, Q, KV, BF16) == "cudnn"
        assert ga.fused_implementation("cudnn", Q, KV, BF16) == "cudnn"
        assert ga.fused_implementation("xla", Q, KV, BF16) is None
        assert ga.fused_implementation("pallas", Q, KV, BF16) is None
        for _ in range(2):
            assert ga.fused_implementation(None, Q, KV, jnp.float32) is None
            assert ga.fused_implementation(None, Q, KV, BF16, None, "attention dropout is in effect") is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # once per distinct reason
    assert "dtype float32" in messages[0] and "dropout" in messages[1]


def test_forcing_cudnn_where_it_cannot_run_names_why(tiny):
    from cairn.models import DecoderOnlyModel, LlamaConfig

    with pytest.raises(ValueError, match=r"attention_implementation='cudnn' cannot run .*built for cpu"):
        ga.fused_implementation("cudnn", Q, KV, BF16)
    with platform.compile_target("gpu"), pytest.raises(ValueError, match="dtype float32 is not bfloat16"):
        ga.fused_implementation("cudnn", Q, KV, jnp.float32)
    # Through a network on CPU: the first attention refuses.
    config = LlamaConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48, num_layers=1)
    model = DecoderOnlyModel(config.replace(attention_implementation="cudnn"))
    params = tiny.random_params(model)
    with pytest.raises(ValueError, match="cannot run this attention: programs are built for cpu"):
        jax.eval_shape(model.module.apply, {"params": params}, jnp.ones((1, 8), jnp.int32))


def _recording(monkeypatch, substitute: str | None = None) -> list[str]:
    """Records the `implementation` of every `gpu_attention.attention` call (each family's cuDNN
    path) and runs it with `substitute` instead (None: as asked)."""
    calls, attention = [], ga.attention

    def record(*args, implementation=ga.KERNEL, **kwargs):
        calls.append(implementation)
        return attention(*args, implementation=substitute or implementation, **kwargs)

    monkeypatch.setattr(ga, "attention", record)
    return calls


def test_every_family_takes_cudnn_automatically_on_gpu(tiny, monkeypatch, caplog):
    # Traced for a GPU (nothing runs): bfloat16 networks call cuDNN in every attention (T5:
    # encoder, decoder and cross-attention); float32 ones take XLA's and say why.
    from cairn.models import DecoderOnlyModel, EncoderDecoderModel, LlamaConfig

    llama = LlamaConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48, num_layers=2)
    seg = jnp.asarray([[1] * 10 + [2] * 6], jnp.int32)
    tokens = jnp.ones((1, 16), jnp.int32)
    prefix = jnp.asarray([[1] * 4 + [0] * 12], jnp.int32)
    cases = [
        (DecoderOnlyModel, llama, (tokens, seg), 2),
        (DecoderOnlyModel, tiny.decoder_only, (tokens, seg, prefix), 2),
        (EncoderDecoderModel, tiny.t5_1_1, (tokens, tokens), 2 + 2 * 2),
    ]
    calls = _recording(monkeypatch, "xla")
    monkeypatch.setattr(ga, "_logged", set())
    caplog.set_level(logging.WARNING, logger=ga.__name__)
    for make, config, inputs, attentions in cases:
        params = tiny.random_params(make(config))
        for dtype, want in (("bfloat16", ["cudnn"] * attentions), ("float32", [])):
            model = make(config.replace(dtype=dtype))
            calls.clear()
            with platform.compile_target("gpu"):
                jax.eval_shape(model.module.apply, {"params": params}, *inputs)
            assert calls == want, (type(config).__name__, dtype)
    assert [r.getMessage() for r in caplog.records] == [
        "cuDNN attention not used (XLA's instead): dtype float32 is not bfloat16 or float16"
    ]


def _assert_fused_equals_xla(make, config, tiny, inputs, real, monkeypatch, attentions: int):
    """`make(config)`'s network with every attention through the cuDNN path (its arguments as
    for cuDNN, run by `jax.nn.dot_product_attention`'s "xla") against "xla" (the families' own
    attention): equal logits at real positions and equal gradients of a random projection."""
    xla = make(config.replace(attention_implementation="xla"))
    fused = make(config.replace(attention_implementation="cudnn"))
    params = tiny.random_params(xla, std=0.3)
    calls = _recording(monkeypatch)
    choose = ga.fused_implementation
    monkeypatch.setattr(ga, "fused_implementation", lambda impl, *a: "xla" if impl == "cudnn" else choose(impl, *a))

    proj = tiny.projection(xla, params, inputs, real)
    want = tiny.projected_run(xla, params, inputs, proj)
    assert calls == []
    got = tiny.projected_run(fused, params, inputs, proj)
    assert calls == ["xla"] * attentions
    tiny.assert_runs_agree(got, want, real)


LLAMA_KW = dict(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48, num_layers=1)


def test_llama_cudnn_call_equals_xla_causal_grouped_packed(tiny, monkeypatch):
    """Causal, grouped-query heads (4 over 2), packed rows with padding: `is_causal` and the
    segment mask as a bias."""
    from cairn.models import DecoderOnlyModel, LlamaConfig

    seg = np.array([[1] * 9 + [2] * 5 + [0] * 2, [1] * 16], np.int32)
    tokens = tiny.random_tokens(1, (2, 16), 64) * (seg > 0)
    args = (DecoderOnlyModel, LlamaConfig(**LLAMA_KW), tiny, (tokens, seg), jnp.asarray(seg > 0), monkeypatch, 1)
    _assert_fused_equals_xla(*args)


def test_prefix_lm_cudnn_call_equals_xla(tiny, monkeypatch):
    """A prefix LM's per-row mask, packed (Llama: the mask; GPT-style: folded into its position
    bias `[b, heads, l, l]`, with the segment mask on top)."""
    from cairn.models import DecoderOnlyModel, LlamaConfig

    seg = np.array([[1] * 10 + [2] * 6, [1] * 14 + [0] * 2], np.int32)
    prefix = np.array([[1] * 4 + [0] * 6 + [1] * 3 + [0] * 3, [1] * 7 + [0] * 9], np.int32)
    tokens = tiny.random_tokens(4, (2, 16), 64) * (seg > 0)
    real = jnp.asarray(seg > 0)
    inputs = (tokens, seg, prefix)
    _assert_fused_equals_xla(DecoderOnlyModel, LlamaConfig(**LLAMA_KW), tiny, inputs, real, monkeypatch, 1)
    _assert_fused_equals_xla(DecoderOnlyModel, tiny.decoder_only, tiny, inputs, real, monkeypatch, 2)


def test_t5_cudnn_call_equals_xla_with_position_bias_and_padding(tiny, monkeypatch):
    """T5's relative position bias as cuDNN's `bias` (its gradient reaches the tables), padded
    inputs as the mask: encoder, causal decoder and cross-attention."""
    from cairn.models import EncoderDecoderModel

    config = tiny.t5_1_1.replace(num_encoder_layers=1, num_decoder_layers=1)
    inputs = tiny.random_tokens(2, (2, 16), 67)
    inputs[0, 11:] = 0  # padding: the encoder's segment ids come from the tokens
    targets = tiny.random_tokens(3, (2, 12), 67)
    real = jnp.ones((2, 12), bool)
    _assert_fused_equals_xla(EncoderDecoderModel, config, tiny, (inputs, targets), real, monkeypatch, 3)


def test_attention_kernel_policy_keeps_the_fused_calls_residuals(tiny, monkeypatch):
    # The cuDNN call's residuals other than its inputs (cuDNN's: its output and log-sum-exp;
    # here, run by XLA, XLA's) are named `attention_kernel`: that policy saves them and "full"
    # does not; keys and values (inputs) are never among them.
    from cairn.models import DecoderOnlyModel, LlamaConfig

    config = LlamaConfig(**LLAMA_KW, attention_implementation="cudnn")
    monkeypatch.setattr(ga, "fused_implementation", lambda *a: "xla")
    params = tiny.random_params(DecoderOnlyModel(config))
    tokens = tiny.random_tokens(5, (2, 16), 64)
    batch = {
        "decoder_input_tokens": tokens,
        "decoder_target_tokens": tokens,
        "decoder_loss_weights": np.ones((2, 16), np.float32),
    }

    def named(policy):
        model = DecoderOnlyModel(config.replace(remat_policy=policy))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            jax.ad_checkpoint.print_saved_residuals(lambda p: model.loss_fn(p, batch)[0], params)
        return [line for line in out.getvalue().splitlines() if "named 'attention_kernel'" in line]

    kept = named("attention_kernel")
    assert kept and not named("full")
    assert not any(line.startswith("f32[2,16,2,8]") for line in kept)  # keys, values: recomputed
