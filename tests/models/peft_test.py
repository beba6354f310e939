"""Hugging Face PEFT LoRA adapters both ways (`cairn.models.peft_interchange`): a Cairn LoRA
exported as a PEFT adapter loads with peft onto the transformers model `export_hf` wrote from
the same base, and an adapter saved by peft imports onto the base, with logits equal within 1e-4,
for Llama and Mixtral (scanned; experts per expert and fused) and T5; what Cairn does not
compute is refused, naming the field."""

import functools
import json
import shutil

import hf_compare
import jax
import numpy as np
import peft
import pytest
import torch
import transformers

from cairn.models import DecoderOnlyModel, EncoderDecoderModel, LoraConfig, LoraModel, T5Config, export_hf
from cairn.models.llama import hf as llama_hf
from cairn.models.llama.hf_config import config_from_hf
from cairn.models.lora import merge
from cairn.models.peft_interchange import PeftInterchangeError, export_peft, import_peft

TOKENS = np.random.default_rng(0).integers(1, hf_compare.LLAMA["vocab_size"], (2, 24)).astype(np.int32)


@pytest.fixture(scope="module")
def bases(tiny, tmp_path_factory):
    """Per family: (config, random Cairn params, the directory `export_hf` wrote them to)."""
    llama = config_from_hf({**hf_compare.LLAMA, "model_type": "llama"}, scan_layers=True)
    mixtral = config_from_hf({**hf_compare.MIXTRAL, "model_type": "mixtral"}, scan_layers=True)
    out = {}
    for name, config, model in (
        ("llama", llama, DecoderOnlyModel(llama)),
        ("mixtral", mixtral, DecoderOnlyModel(mixtral)),
        ("t5", tiny.t5_1_1, EncoderDecoderModel(tiny.t5_1_1)),
    ):
        params = tiny.random_params(model)  # std 0.2: at 0.3 T5 in float32 is 2e-4 from float64
        directory = str(tmp_path_factory.mktemp(name))
        (llama_hf.export_hf if name != "t5" else export_hf)(params, config, directory)
        out[name] = (config, params, directory)
    return out


def _batch(name):
    if name != "t5":
        return {"decoder_input_tokens": TOKENS}
    tokens = TOKENS % 60 + 2  # the tiny T5's vocabulary is 67
    return {"encoder_input_tokens": tokens[:, :13], "decoder_input_tokens": np.pad(tokens[:, :7], ((0, 0), (1, 0)))}


@functools.lru_cache
def _apply(config):
    model = EncoderDecoderModel(config) if isinstance(config, T5Config) else DecoderOnlyModel(config)
    return jax.jit(model.apply)


def _ours(name, config, params):
    """Cairn's logits (one compiled apply per config, base and adapted alike)."""
    return np.asarray(_apply(config)(params, _batch(name)))


def _theirs(name, model):
    batch = {k: torch.tensor(v, dtype=torch.long) for k, v in _batch(name).items()}
    with torch.no_grad():
        if name == "t5":
            return model(
                input_ids=batch["encoder_input_tokens"], decoder_input_ids=batch["decoder_input_tokens"]
            ).logits.numpy()
        return model(batch["decoder_input_tokens"]).logits.numpy()


def _transformers(name, directory):
    cls = transformers.T5ForConditionalGeneration if name == "t5" else transformers.AutoModelForCausalLM
    return cls.from_pretrained(directory).eval()


def _close(ours, theirs, base):
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
    assert np.abs(ours - base).max() > 0.05  # the adapter changes the logits


@pytest.mark.parametrize("name", ["llama", "mixtral", "t5"])
def test_exported_adapter_loads_in_peft_with_equal_logits(name, bases, tmp_path):
    config, params, base_dir = bases[name]
    model = EncoderDecoderModel(config) if name == "t5" else DecoderOnlyModel(config)
    lora = LoraConfig(rank=4, alpha=6.0, dropout=0.1)
    adapters = LoraModel(model, lora).init(jax.random.PRNGKey(1))
    rng = np.random.default_rng(2)
    adapters = jax.tree.map(lambda x: np.asarray(x) + 0.1 * rng.standard_normal(x.shape).astype(np.float32), adapters)
    directory = export_peft(adapters, lora, config, str(tmp_path / "adapter"), base_model_name_or_path=base_dir)
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (written["r"], written["lora_alpha"], written["lora_dropout"]) == (4, 6.0, 0.0 if name == "mixtral" else 0.1)
    hf = peft.PeftModel.from_pretrained(_transformers(name, base_dir), directory).eval()
    ours = _ours(name, config, merge(params, adapters, lora))
    _close(ours, _theirs(name, hf), _ours(name, config, params))
    # and back: the same adapters, exactly
    lora_back, back = import_peft(directory, config)
    assert (lora_back.rank, lora_back.scale) == (4, 1.5)
    jax.tree.map(np.testing.assert_array_equal, back, jax.tree.map(np.asarray, adapters))


# name: peft.LoraConfig arguments of the adapter peft trains and saves.
SAVED_BY_PEFT = {
    "llama": dict(
        target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
        rank_pattern={"o_proj": 2},  # padded to rank 4, its scale folded into B
        alpha_pattern={"down_proj": 3},
    ),
    # transformers 5's fused experts, through target_parameters
    "mixtral": dict(target_modules=["k_proj"], target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    "t5": dict(target_modules=["q", "v", "wi_0", "wo"], lora_dropout=0.05),
}


@pytest.mark.parametrize("name", sorted(SAVED_BY_PEFT))
def test_adapter_saved_by_peft_imports_with_equal_logits(name, bases, tmp_path):
    config, params, base_dir = bases[name]
    torch.manual_seed(0)
    kwargs = SAVED_BY_PEFT[name]
    hf = peft.get_peft_model(_transformers(name, base_dir), peft.LoraConfig(r=4, lora_alpha=8, **kwargs)).eval()
    with torch.no_grad():  # B starts at zero: train it a little, by hand
        for key, p in hf.named_parameters():
            if "lora_B" in key:
                p.copy_(0.3 * torch.randn_like(p))
    hf.save_pretrained(str(tmp_path))
    lora, adapters = import_peft(str(tmp_path), config)
    assert lora.dropout == kwargs.get("lora_dropout", 0.0) and lora.rank == 4
    _close(_ours(name, config, merge(params, adapters, lora)), _theirs(name, hf), _ours(name, config, params))
    # Cairn's targets select exactly the imported kernels
    from cairn.models.lora import init_adapters

    model = EncoderDecoderModel(config) if name == "t5" else DecoderOnlyModel(config)
    boxed = jax.eval_shape(lambda: model.init_boxed(jax.random.PRNGKey(0)))
    import flax.linen as nn

    fresh, _ = init_adapters(jax.random.PRNGKey(0), nn.meta.unbox(boxed), nn.get_partition_spec(boxed), lora)
    assert jax.tree.map(np.shape, fresh) == jax.tree.map(np.shape, adapters)


@pytest.fixture(scope="module")
def adapter_dir(bases, tmp_path_factory):
    """A small exported Llama adapter to edit."""
    config, _, _ = bases["llama"]
    adapters = LoraModel(DecoderOnlyModel(config), LoraConfig(rank=2)).init(jax.random.PRNGKey(0))
    return export_peft(adapters, LoraConfig(rank=2), config, str(tmp_path_factory.mktemp("adapter")))


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(use_dora=True), "use_dora"),
        (dict(use_rslora=True), "use_rslora"),
        (dict(bias="lora_only"), "bias"),
        (dict(modules_to_save=["lm_head"]), "modules_to_save"),
        (dict(layers_to_transform=[0]), "layers_to_transform"),
        (dict(init_lora_weights="pissa"), "init_lora_weights"),
        (dict(peft_type="IA3"), "peft_type"),
        (dict(r=0), "r"),
    ],
)
def test_unsupported_options_are_refused_naming_the_field(changes, field, bases, adapter_dir, tmp_path):
    shutil.copytree(adapter_dir, tmp_path / "a")
    written = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps({**written, **changes}))
    with pytest.raises(PeftInterchangeError, match=rf"^{field}="):
        import_peft(str(tmp_path / "a"), bases["llama"][0])


def test_unmappable_modules_and_tensors_are_refused(bases, tmp_path):
    from cairn.models.peft_interchange import from_peft_state_dict, to_peft_state_dict

    config = bases["mixtral"][0]
    router = {
        "layers": {"mlp": {"router": {"kernel": {"lora_a": np.zeros((2, 32, 2)), "lora_b": np.zeros((2, 2, 4))}}}}
    }
    with pytest.raises(PeftInterchangeError, match=r"LoRA target 'layers_0/mlp/router/kernel' has no PEFT module"):
        to_peft_state_dict(router, config)
    peft_config = {"r": 2, "lora_alpha": 4}
    embedding = {"base_model.model.model.embed_tokens.lora_embedding_A": np.zeros((2, 101))}
    with pytest.raises(PeftInterchangeError, match="lora_embedding_A' is not a LoRA factor"):
        from_peft_state_dict(embedding, peft_config, config)
    lm_head = {f"base_model.model.lm_head.lora_{f}.weight": np.zeros((2, 2)) for f in "AB"}
    with pytest.raises(PeftInterchangeError, match="'lm_head' has no kernel Cairn adapts"):
        from_peft_state_dict(lm_head, peft_config, config)
    q = {f"base_model.model.model.layers.0.self_attn.q_proj.lora_{f}.weight": np.zeros((2, 3)) for f in "AB"}
    with pytest.raises(PeftInterchangeError, match=r"q_proj' has lora_A \[2, 3\]"):
        from_peft_state_dict(q, peft_config, config)


def test_scanned_t5_round_trips_and_a_kind_missing_in_a_layer_gets_zeros(tiny, bases):
    """A scanned T5's adapters (both stacks) export and import exactly; an adapter of one layer's
    q_proj only (a regex target in peft) imports onto a scanned Llama with zeros in the other."""
    from cairn.models.peft_interchange import from_peft_state_dict, to_peft_state_dict

    config = tiny.t5_1_0.replace(scan_layers=True)  # ungated MLP (`wi`), 3 decoder layers
    lora = LoraConfig(rank=2, alpha=3.0)
    adapters = jax.tree.map(np.asarray, LoraModel(EncoderDecoderModel(config), lora).init(jax.random.PRNGKey(0)))
    tensors = to_peft_state_dict(adapters, config)
    assert "base_model.model.decoder.block.2.layer.2.DenseReluDense.wi.lora_B.weight" in tensors
    back_lora, back = from_peft_state_dict(tensors, {"r": 2, "lora_alpha": 3.0}, config)
    assert back_lora.scale == lora.scale
    jax.tree.map(np.testing.assert_array_equal, back, adapters)

    llama = bases["llama"][0]
    rng = np.random.default_rng(0)
    q = {
        "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight": rng.standard_normal((2, 32), np.float32),
        "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight": rng.standard_normal((32, 2), np.float32),
    }
    lora, imported = from_peft_state_dict(q, {"r": 2, "lora_alpha": 4}, llama)
    assert lora.targets == (r"(^|/)layers(_\d+)?/attention/query/kernel$",) and lora.scale == 2.0
    a, b = (
        imported["layers"]["attention"]["query"]["kernel"]["lora_a"],
        imported["layers"]["attention"]["query"]["kernel"]["lora_b"],
    )
    assert a.shape == (2, 32, 2) and b.shape == (2, 2, 4, 8) and not a[0].any() and not b[0].any()
    np.testing.assert_array_equal(
        b[1].reshape(2, 32).T, q["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"]
    )
