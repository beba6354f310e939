"""The llama_150m rows of models_bench.py: a float32 training step (AdamW) and greedy
prefill + decode, cairn (jax) beside transformers' `LlamaForCausalLM` (torch), same weights.

The weights reach torch through `cairn.models.llama.hf.export_hf` (a transformers folder),
so both sides run the same model on the same random tokens; the first-step losses are
printed side by side as the check. Torch computes the same loss as cairn (mean token
cross-entropy of the logits against the shifted targets, no z-loss) and uses all cores.
Greedy decoding: prompts of PROMPT tokens (after a BOS 0 on both sides), NEW generated tokens
(EOS disabled on both sides: cairn `eos_id=-1`, transformers `min_new_tokens=NEW`), tokens/s
counting prompt and new tokens.
"""

from __future__ import annotations

import functools
import os
import tempfile

import jax
import numpy as np
from _timing import DECODE_FLOOR, ceiling_line, decode_floor, median_time, target_line

from cairn.models import DecodeOptions, DecoderOnlyModel, get_preset, training_flops_per_step

PRESET = "llama_150m"
BATCH, LENGTH = 4, 128  # training: 512 tokens, ~0.42 TFLOP a step
DECODE_BATCH, PROMPT, NEW = 4, 64, 32
TARGETS = {"mfu": 0.70, "train": 1.5, "decode": 2.0}


def make_batch(vocab: int) -> dict[str, np.ndarray]:
    rows = np.random.default_rng(0).integers(2, vocab, (BATCH, LENGTH + 1)).astype(np.int32)
    return {
        "decoder_input_tokens": rows[:, :-1],
        "decoder_target_tokens": rows[:, 1:],
        "decoder_loss_weights": np.ones((BATCH, LENGTH), np.float32),
    }


def cairn_train(model, params, batch, steps: int):
    """(median step s, compile s, each step's metrics as floats); AdamW, params and state
    donated (the caller's `params` are copied first). `_moe_bench.py` uses it too."""
    import time

    import optax

    opt = optax.adamw(1e-4, weight_decay=0.0)

    @functools.partial(jax.jit, donate_argnums=(0,))
    def step(state, batch):
        params, opt_state = state
        (_, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), metrics

    copy = jax.tree_util.tree_map(lambda x: x.copy(), params)  # the caller keeps `params`
    holder, history = [(copy, opt.init(copy))], []
    batch = jax.device_put(batch)

    def run():
        holder[0], metrics = step(holder[0], batch)
        history.append({k: float(v) for k, v in metrics.items()})

    t = time.perf_counter()
    run()
    compile_s = time.perf_counter() - t
    return median_time(run, steps), compile_s, history


def cairn_decode(model, params, prompts, repeats: int):
    """(median s, tokens [b, PROMPT + NEW])."""
    options = DecodeOptions(max_decode_length=PROMPT + NEW, eos_id=-1)
    f = jax.jit(lambda p, x: model.predict_batch(p, x, options)[0])
    out = []
    s = median_time(lambda: out.append(np.asarray(f(params, prompts))), repeats)
    return s, out[-1]


def torch_model(config, params):
    import transformers

    from cairn.models.llama.hf import export_hf

    with tempfile.TemporaryDirectory() as d:
        export_hf(params, config, d)
        return transformers.LlamaForCausalLM.from_pretrained(d, torch_dtype="float32")


def torch_train(model, batch, steps: int):
    """(median step s, first loss): the same loss, torch.optim.AdamW with the same settings."""
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    ids = torch.tensor(batch["decoder_input_tokens"], dtype=torch.long)
    targets = torch.tensor(batch["decoder_target_tokens"], dtype=torch.long).reshape(-1)
    losses = []

    def run():
        opt.zero_grad()
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    return median_time(run, steps), losses[0]


def torch_decode(model, prompts, repeats: int):
    """(median s, tokens [b, PROMPT + NEW]) of greedy `generate` with EOS disabled."""
    import torch

    model.eval()
    # cairn's predict_batch feeds the preset's prompt_start_id (0) before each prompt: so does this.
    ids = torch.tensor(np.pad(prompts, ((0, 0), (1, 0))), dtype=torch.long)
    out = []

    def run():
        with torch.no_grad():
            out.append(
                model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=NEW,
                    min_new_tokens=NEW,
                    do_sample=False,
                    num_beams=1,
                    pad_token_id=0,
                )
            )

    s = median_time(run, repeats)
    return s, out[-1].numpy()[:, 1:]  # without the BOS: the prompt then the new tokens, as cairn's


def llama_decode_floor(config, params, peak: float) -> float:
    """`_timing.decode_floor` of this table's prefill + decode: every weight is read each step
    (the logits table included; an untied input embedding is only gathered)."""
    prefill = training_flops_per_step(config, DECODE_BATCH, {"targets": PROMPT}) / 3  # forward only
    weights = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
    if not config.tie_word_embeddings:
        weights -= params["token_embedder"]["embedding"].nbytes
    return decode_floor(prefill, peak, NEW, weights, DECODE_BATCH)


def run(peak: float, steps: int, decode_steps: int, skip_torch: bool, preset: str = PRESET) -> None:
    """Measures and prints the table of `preset` (default llama_150m; targets and verdicts included)."""
    config = get_preset(preset)
    model = DecoderOnlyModel(config, z_loss=0.0, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")  # mean, as torch
    params = model.init(jax.random.PRNGKey(0))
    batch = make_batch(config.vocab_size)
    prompts = np.random.default_rng(1).integers(2, config.vocab_size, (DECODE_BATCH, PROMPT)).astype(np.int32)
    flops = training_flops_per_step(config, BATCH, {"targets": LENGTH})
    step_s, compile_s, history = cairn_train(model, params, batch, steps)
    loss0 = history[0]["loss"]
    decode_s, tokens = cairn_decode(model, params, prompts, decode_steps)
    rows = [("cairn (jax)", step_s, decode_s, loss0)]
    match = None
    if not skip_torch:
        try:
            import torch

            tm = torch_model(config, params)
            t_step, t_loss0 = torch_train(tm, batch, steps)
            tm = torch_model(config, params)  # untrained weights again, as cairn's decode uses
            t_decode, t_tokens = torch_decode(tm, prompts, decode_steps)
            rows.append((f"transformers (torch, {torch.get_num_threads()} thr)", t_step, t_decode, t_loss0))
            match = float(np.mean(t_tokens[:, PROMPT:] == tokens[:, PROMPT:]))
        except ImportError as e:  # torch/transformers are test-only dependencies
            print(f"transformers column skipped: {e}")
    tok_train, tok_decode = BATCH * LENGTH, DECODE_BATCH * (PROMPT + NEW)
    print(
        f"{preset} (Llama, {config.num_heads}/{config.num_kv_heads} heads GQA, SwiGLU), "
        f"train batch {BATCH} x {LENGTH}, AdamW; "
        f"decode batch {DECODE_BATCH}, prompt {PROMPT} + {NEW} greedy; float32; {os.cpu_count()} cores"
    )
    print(
        f"model FLOPs/step {flops / 1e9:.1f} GFLOP; matmul peak {peak / 1e9:.1f} GFLOP/s; "
        f"cairn compile {compile_s:.1f} s"
    )
    print(f"{'':34}{'step s':>8}{'tokens/s':>10}{'MFU':>7}{'decode s':>10}{'tok/s':>10}{'loss 1':>9}")
    for name, s, d, l0 in rows:
        print(f"{name:34}{s:8.2f}{tok_train / s:10.0f}{flops / s / peak:7.1%}{d:10.2f}{tok_decode / d:10.0f}{l0:9.4f}")
    mfu = flops / step_s / peak
    print(target_line("MFU (of the matmul peak)", mfu, TARGETS["mfu"], percent=True))
    if len(rows) == 2:
        train, decode = rows[1][1] / step_s, rows[1][2] / decode_s
        print(target_line("train step vs transformers", train, TARGETS["train"]))
        print(target_line("prefill + decode vs generate", decode, TARGETS["decode"]))
        print(ceiling_line("train step", rows[1][1], flops / peak, TARGETS["train"]))
        floor = llama_decode_floor(config, params, peak)
        print(ceiling_line("prefill + decode", rows[1][2], floor, TARGETS["decode"], DECODE_FLOOR))
        print(f"greedy tokens equal to generate's: {match:.1%} of the {DECODE_BATCH * NEW} new tokens")
