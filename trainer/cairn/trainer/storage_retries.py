"""orbax's tensorstore reads and writes retried under cairn.storage's one retry budget.

orbax builds every tensorstore context it opens arrays with from two module-level specs
(`tensorstore_utils._BASE_TS_CONTEXT`, and `_DEFAULT_OCDBT_TS_CONTEXT` for OCDBT); the budget's
`gcs_request_retries` (`cairn.storage.retries.tensorstore_context`) is put into both, so a
checkpoint written to or read from `gs://` retries a stuttering bucket for as long as gcsfs and
the direct GET path do, instead of tensorstore's default 32 attempts.
"""

from __future__ import annotations

from cairn.storage import retries

_SPECS = ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT")


def apply_retry_budget(budget: float | None = None) -> bool:
    """Puts the budget (default: `retries.retry_budget()`, read now) into orbax's tensorstore
    context specs. Idempotent; False when this orbax has no such specs (its defaults stay)."""
    try:
        from orbax.checkpoint._src.serialization import tensorstore_utils
    except ImportError:
        return False
    specs = [getattr(tensorstore_utils, name, None) for name in _SPECS]
    dicts = [spec for spec in specs if isinstance(spec, dict)]
    if len(dicts) != len(specs):
        return False
    extra = retries.tensorstore_context(budget)
    for spec in dicts:
        spec.update(extra)
    return True
