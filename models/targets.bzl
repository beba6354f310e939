"""The fine-grained targets of //models: name -> (sources under cairn/models/, deps).

One table, read twice: models/BUILD makes a py_library of each entry, and
//tests/models:build_deps_test parses it (a dict literal, so plain Python reads it too) to check
that every module is in exactly one target and that each target's deps cover the imports of its
modules. A dep is ":<target>" of this package or a library label ("//storage").

Tests and libraries that need part of models depend on these targets, so that a change reruns
only the tests that can see it (docs/testing.md, "The dependency graph"); `//models` is the
umbrella of all of them.
"""

MODELS_TARGETS = {
    # The lazy package (PEP 562): every target below includes it.
    "init": (["__init__.py"], []),
    # Building blocks every network shares: layers, attention, relative positions, layer
    # stacking, the dense-or-routed MLP switch, losses, configs and what routed layers report.
    "core": (
        [
            "argmax.py",
            "attention.py",
            "chunked_loss.py",
            "decode_cache.py",
            "gpu_attention.py",
            "fp8.py",
            "layers.py",
            "losses.py",
            "mlp.py",
            "moe_config.py",
            "moe_metrics.py",
            "pallas_attention.py",
            "relative_position.py",
            "stacking.py",
            "transformer_config.py",
        ],
        [":init", "//partitioning"],
    ),
    # The routed mixture-of-experts MLP: only sparse configs import it (cairn.models.mlp).
    "moe": (["moe.py"], [":core"]),
    "decoding": (
        [
            "decoding/__init__.py",
            "decoding/beam_search.py",
            "decoding/greedy.py",
            "decoding/loop.py",
            "decoding/prompts.py",
            "decoding/sampling.py",
        ],
        [":init"],
    ),
    # The families (docs/contributing.md): one package each, its config, network and presets here,
    # its model, Hugging Face interchange and registration (`family.py`) in the targets below.
    "t5": (["t5/__init__.py", "t5/config.py", "t5/network.py", "t5/presets.py"], [":core"]),
    "gpt": (["gpt/__init__.py", "gpt/config.py", "gpt/network.py", "gpt/presets.py"], [":core", ":t5"]),
    "llama": (
        [
            "llama/__init__.py",
            "llama/attention.py",
            "llama/config.py",
            "llama/network.py",
            "llama/presets.py",
            "llama/rope.py",
        ],
        [":core"],
    ),
    # The models (loss, scoring, decoding) over the networks, parameter counts, and prompt tuning
    # (a prompted params tree is one every model reads).
    "model": (
        ["decoder_only_model.py", "model_base.py", "params.py", "prompt_tuning.py", "t5/model.py"],
        [":core", ":decoding", ":gpt", ":llama", ":t5"],
    ),
    # Hugging Face interchange (safetensors, imported lazily).
    "interchange": (
        ["hf_files.py", "llama/hf.py", "llama/hf_config.py", "t5/hf.py"],
        [":core", ":llama", ":t5", "//storage"],
    ),
    "t5x_checkpoint": (["t5x_checkpoint.py"], [":init", "//storage"]),
    # The family registry with each family's registration, and FLOP counts.
    "families": (
        ["families.py", "flops.py", "gpt/family.py", "llama/family.py", "t5/family.py"],
        [":core", ":gpt", ":interchange", ":llama", ":model", ":t5"],
    ),
    "upcycle": (["moe_upcycle.py"], [":core", ":families"]),
    # LoRA adapters as a parameter transform over any family's params (imports no network).
    "lora": (["lora.py"], [":core"]),
    # Hugging Face PEFT LoRA adapters to and from Cairn's (safetensors, imported lazily).
    "peft": (["peft_interchange.py"], [":core", ":interchange", ":llama", ":lora", ":t5", "//storage"]),
}
