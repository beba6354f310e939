"""Logits of a transformers model and of Cairn's decoder on the same tokens (the Llama and
Mixtral interchange tests)."""

import functools

import jax
import numpy as np
import torch

from cairn.models import DecoderOnlyModel, LlamaConfig

# The tiny transformers configs of the Llama, Mixtral and PEFT interchange tests.
LLAMA = dict(
    vocab_size=101,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
MIXTRAL = dict(LLAMA, num_local_experts=4)


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    """float32 logits of a transformers causal LM (no gradient)."""
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


@functools.lru_cache
def _apply(config: LlamaConfig):
    return jax.jit(DecoderOnlyModel(config).apply)


def our_logits(config: LlamaConfig, params, tokens: np.ndarray) -> np.ndarray:
    """Cairn's logits for `tokens` (one jitted apply per config)."""
    return np.asarray(_apply(config)(params, {"decoder_input_tokens": tokens}))


def check_greedy_equals_generate(hf, config: LlamaConfig, params, prompts: list[list[int]], length: int) -> None:
    """Greedy `predict_batch` equals transformers' `generate` token for token on each prompt as the
    tokenizer produced it (`[bos] + ids`, `bos` the checkpoint's `bos_token_id`, not 0), both ways:
    the imported config puts its `prompt_start_id` (that BOS) in front of the ids, and a config with
    `prompt_start_id=None` takes the whole prompt. transformers decodes one prompt at a time,
    unpadded; no EOS on either side (`eos_id=-1`, `eos_token_id=None`)."""
    from cairn.models import DecodeOptions, get_family

    bos = hf.config.bos_token_id
    assert bos not in (None, 0) and config.prompt_start_id == bos
    family = get_family("llama")
    width = max(map(len, prompts))
    ids = np.array([p + [0] * (width - len(p)) for p in prompts], np.int32)
    with_bos = np.pad(ids, ((0, 0), (1, 0)), constant_values=bos)
    hf.generation_config.eos_token_id = None  # else `generate` refills it from generation_config
    options = DecodeOptions(max_decode_length=length, eos_id=-1)
    got = {}
    for start, given in ((bos, ids), (None, with_bos)):
        model = family.make_model(config.replace(prompt_start_id=start))
        predict = jax.jit(functools.partial(model.predict_batch, options=options))
        got[start] = np.asarray(predict(params, family.decode_batch(given))[0])
    for row, prompt in enumerate(prompts):
        tokenized = [bos] + prompt
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([tokenized]),
                attention_mask=torch.ones((1, len(tokenized)), dtype=torch.long),
                max_new_tokens=length - len(prompt),
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0].tolist()
        assert got[bos][row].tolist() == want[1:]  # the output starts with the prompt it was given
        assert got[None][row].tolist() == want[:length]
        assert len(set(want[len(tokenized) :])) > 1  # the continuation is not one repeated token
