"""A server's process, for export_test: TensorFlow alone (JAX, jaxlib and Cairn cannot be
imported: their modules are set to None first), loading SavedModels and calling their
signatures. `python serve_saved_model.py REQUESTS.json` reads `[{"path", "signature",
"inputs", "seed"?, "dtype"?}]` and prints one JSON line: `[{"outputs", "scores", "output_ids"}]`
per request (`{"error": "Type: message"}` for a refused one, its whitespace collapsed), with `"blocked"`, the names of
the blocked modules still not imported."""

import json
import sys

BLOCKED = ("jax", "jaxlib", "cairn")
for name in BLOCKED:
    sys.modules[name] = None  # type: ignore[assignment]  # an import of it raises ImportError

import tensorflow as tf  # noqa: E402


def main(path: str) -> None:
    answers = []
    loaded = {}
    for request in json.loads(open(path).read()):
        if request["path"] not in loaded:
            loaded[request["path"]] = tf.saved_model.load(request["path"])
        fn = loaded[request["path"]].signatures[request["signature"]]
        args = {"inputs": tf.constant(request["inputs"], getattr(tf, request.get("dtype", "string")))}
        if "seed" in request:
            args["seed"] = tf.constant(request["seed"], tf.int32)
        try:
            out = fn(**args)
        except Exception as e:  # a refused request: its error's type and first line
            answers.append({"error": f"{type(e).__name__}: {' '.join(str(e).split())[:3000]}"})
            continue
        answers.append(
            {
                "outputs": [o.decode("utf-8") for o in out["outputs"].numpy()],
                "scores": out["scores"].numpy().tolist(),
                "output_ids": out["output_ids"].numpy().tolist(),
            }
        )
    blocked = sorted(n for n in BLOCKED if sys.modules.get(n) is None)
    print(json.dumps({"answers": answers, "blocked": blocked}))


if __name__ == "__main__":
    main(sys.argv[1])
