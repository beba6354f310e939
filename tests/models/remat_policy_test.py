"""The named remat policies save what they say (`layers.remat_policy`: read off
`jax.ad_checkpoint.print_saved_residuals`, no compile), and T5's `float32_attention_logits=False`
keeps XLA's attention logits in the compute dtype (t5x's default) with the same loss to bfloat16
rounding; the offloaded policies move the same residuals to the host, and RoPE's TPU form (the
rotated half as a product) equals the sliced one."""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cairn.models import DecoderOnlyModel, EncoderDecoderModel, LlamaConfig, T5Config

MLP = 96  # the MLP's width: its products are the residuals `[tokens, 96]`
LLAMA = LlamaConfig(
    vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=MLP, num_layers=2, init_std=0.2
)


def _batch(b: int = 2, length: int = 16, vocab: int = 64, encoder: int = 0) -> dict:
    rng = np.random.default_rng(0)
    targets = rng.integers(2, vocab, (b, length)).astype(np.int32)
    batch = {
        "decoder_input_tokens": np.roll(targets, 1, axis=1),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": np.ones((b, length), np.float32),
    }
    if encoder:
        batch["encoder_input_tokens"] = rng.integers(2, vocab, (b, encoder)).astype(np.int32)
    return batch


def _saved(policy: str, params) -> list[str]:
    """The residuals the backward pass reads under `policy` (one line each)."""
    model = DecoderOnlyModel(LLAMA.replace(remat_policy=policy))
    batch = _batch()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(lambda p: model.loss_fn(p, batch)[0], params)
    return [line for line in out.getvalue().splitlines() if "from the argument" not in line]


def _mlp_products(lines: list[str]) -> int:
    return sum(f",{MLP}]" in line.split(" ")[0] for line in lines)


def test_named_policies_save_less_of_the_mlp(tiny):
    # What is saved depends on the shapes, not the values: numpy-drawn parameters (no init compiled).
    params = tiny.random_params(DecoderOnlyModel(LLAMA))
    dots, except_wi, minimal = (_saved(p, params) for p in ("dots", "dots_except_mlp_wi", "minimal"))
    assert _mlp_products(dots) >= 2 * LLAMA.num_layers  # the gate's and up's products, per layer
    assert _mlp_products(except_wi) == 0 and _mlp_products(minimal) == 0
    for name in ("query_proj", "key_proj", "value_proj", "out_proj"):
        assert sum(f"named '{name}'" in line for line in except_wi) == LLAMA.num_layers, name
        assert sum(f"named '{name}'" in line for line in minimal) == LLAMA.num_layers, name
    kv = _saved("kv_projections", params)
    assert _mlp_products(kv) == 0 and not any("named 'query_proj'" in line for line in kv)
    assert sum("named 'key_proj'" in line or "named 'value_proj'" in line for line in kv) == 2 * LLAMA.num_layers
    wi = _saved("mlp_wi", params)  # the MLP's input products, no projection
    assert _mlp_products(wi) == 2 * LLAMA.num_layers and not any("_proj'" in line for line in wi)
    with pytest.raises(ValueError, match="remat_policy"):
        LLAMA.replace(remat_policy="some")


def test_attention_kernel_policy_saves_only_the_kernels_residuals(tiny):
    # "attention_kernel": the Pallas kernel's output and log-sum-exp per layer (so the backward
    # does not run the kernel's forward again), nothing else named; under XLA's attention
    # nothing carries that name and it saves what "full" saves.
    config = LLAMA.replace(attention_implementation="pallas")
    params = tiny.random_params(DecoderOnlyModel(config))
    batch = _batch(length=128)

    def saved(cfg, policy):
        model = DecoderOnlyModel(cfg.replace(remat_policy=policy))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            jax.ad_checkpoint.print_saved_residuals(lambda p: model.loss_fn(p, batch)[0], params)
        return [line for line in out.getvalue().splitlines() if "from the argument" not in line]

    def kernel_outputs(lines):  # the kernel's output and log-sum-exp, read by its backward
        return sum("function '_splash_attention'" in line for line in lines)

    kept, full = saved(config, "attention_kernel"), saved(config, "full")
    assert kernel_outputs(kept) == 2 * LLAMA.num_layers and kernel_outputs(full) == 0
    assert not any(" named '" in line for line in kept)  # no projection or MLP product
    assert _mlp_products(kept) == 0
    assert len(kept) == len(full) + 2 * LLAMA.num_layers
    assert len(saved(LLAMA, "attention_kernel")) == len(saved(LLAMA, "full"))


def test_offloaded_policies_move_the_same_residuals_to_the_host(tiny):
    # "<policy>_offloaded" saves what "<policy>" saves, each named residual moved to host memory
    # after the forward and back for the backward (a `device_put` pair), with the same gradients.
    params = tiny.random_params(DecoderOnlyModel(LLAMA))
    batch = _batch()
    grads, puts = {}, {}
    for policy in ("none", "minimal", "minimal_offloaded"):
        model = DecoderOnlyModel(LLAMA.replace(remat_policy=policy))
        fn = jax.grad(lambda p, m=model: m.loss_fn(p, batch)[0])
        text = str(jax.make_jaxpr(fn)(params))
        puts[policy] = text.count("device_put[")
        if policy != "minimal":
            grads[policy] = jax.jit(fn)(params)
    # the four projections and the kernel's residuals (out or the attention product), per layer
    assert puts["none"] == puts["minimal"] == 0
    assert puts["minimal_offloaded"] >= 2 * 4 * LLAMA.num_layers
    on_device, offloaded = _saved("minimal", params), _saved("minimal_offloaded", params)
    assert len(offloaded) == len(on_device)
    named_ones = sum(" named '" in line for line in on_device)
    assert named_ones >= 4 * LLAMA.num_layers
    assert sum(line.split(" ")[0].split("<host>")[0] != line.split(" ")[0] for line in offloaded) == named_ones
    for a, b in zip(jax.tree.leaves(grads["minimal_offloaded"]), jax.tree.leaves(grads["none"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_t5_attention_logits_in_the_compute_dtype(tiny):
    cfg = T5Config(
        vocab_size=64,
        emb_dim=32,
        num_heads=2,
        head_dim=16,
        mlp_dim=48,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dtype="bfloat16",
    )
    batch = _batch(length=8, encoder=24)
    # normal(0, 0.2) kernels, about the init's scale for these widths (1/sqrt(32)), drawn with numpy
    params = tiny.random_params(EncoderDecoderModel(cfg))
    losses, einsums = {}, {}
    for f32 in (True, False):
        model = EncoderDecoderModel(cfg.replace(float32_attention_logits=f32))
        fn = lambda p, m=model: m.loss_fn(p, batch)[0]
        text = str(jax.make_jaxpr(fn)(params))
        # the encoder's attention logits `[b, heads, q, k]`: float32, or bfloat16 without float32 logits
        einsums[f32] = {dt for dt in ("f32", "bf16") if f"{dt}[2,2,24,24] = dot_general" in text}
        losses[f32] = float(jax.jit(fn)(params))  # one program (op by op, each op compiles its own)
    assert einsums == {True: {"f32"}, False: {"bf16"}}
    assert np.isfinite(losses[False]) and losses[False] == pytest.approx(losses[True], rel=2e-2)
    assert jnp.dtype(cfg.dtype) == jnp.bfloat16


def test_rope_rotation_by_matmul_equals_the_sliced_halves():
    # The TPU form (`via_matmul`: the rotated half as a product with a +-1 permutation) gives the
    # sliced form's numbers exactly, forward and (float32) backward; a bfloat16 gradient within
    # one bfloat16 rounding (its two terms are rounded apart).
    from cairn.models.llama.rope import config_rope_tables, rotate

    cfg = LlamaConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48, num_layers=1)
    tables = config_rope_tables(cfg, jnp.asarray(np.arange(12, dtype=np.int32).reshape(2, 6) * 7))
    x = np.random.default_rng(3).normal(size=(2, 6, 4, 8)).astype(np.float32)
    for dtype in (jnp.float32, jnp.bfloat16):
        xs = jnp.asarray(x, dtype)
        outs = [np.asarray(rotate(xs, tables, via_matmul=m), np.float32) for m in (False, True)]
        np.testing.assert_array_equal(outs[0], outs[1])
        grads = [
            jax.grad(lambda a, m=m: jnp.sum(rotate(a, tables, via_matmul=m).astype(jnp.float32) ** 2))(xs)
            for m in (False, True)
        ]
        tol = 1e-6 if dtype == jnp.float32 else 2**-7
        a, b = (np.asarray(g, np.float32) for g in grads)
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(a).max())
