"""One start-up step that points every storage client at the same place.

Each library that touches `gs://` has its own switch, so `STORAGE_EMULATOR_HOST` (what
google-cloud-storage and gcsfs read) is mapped onto the others:

| client | reads | set to |
|---|---|---|
| gcsfs (Cairn's own I/O, and `etils.epath` for orbax's metadata) | `STORAGE_EMULATOR_HOST` | as given |
| tensorstore (orbax's array writes) | `TENSORSTORE_GCS_HTTP_URL` | the emulator |
| google-cloud-cpp (array-record opening `gs://` shards itself) | `CLOUD_STORAGE_EMULATOR_ENDPOINT` | the emulator |

Against an emulator no credentials are looked up: gcsfs gets `token="anon"`, tensorstore a
fixed test token (`GOOGLE_AUTH_TOKEN_FOR_TESTING`), and gcsfs's bucket-type probe over gRPC
(which costs about 60 s against an HTTP emulator) is switched off
(`GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`).

Always: `etils.epath` is told not to route URLs through TensorFlow's file system
(`EPATH_USE_TF=false`). TensorFlow's GCS client has no endpoint override, so with it an
emulator (and the tests) could never see orbax's metadata writes; with fsspec every
`gs://` access goes through gcsfs.

Variables already set by the user are left as they are.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"


def emulator_endpoint(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The emulator's base URL (`http://host:port`) when `STORAGE_EMULATOR_HOST` is set."""
    value = (os.environ if environ is None else environ).get(EMULATOR_VARIABLE, "").strip()
    if not value:
        return None
    return value if "://" in value else f"http://{value}"


def configure_environment(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Sets the variables above (those not already set); returns what it set. Idempotent.

    Call before the first `gs://` access (importing `cairn.storage` calls it)."""
    env = os.environ if environ is None else environ
    wanted = {"EPATH_USE_TF": "false"}
    endpoint = emulator_endpoint(env)
    if endpoint:
        wanted.update(
            {
                "TENSORSTORE_GCS_HTTP_URL": endpoint,
                "CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint,
                "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
                "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
            }
        )
    done = {}
    for key, value in wanted.items():
        if key not in env:
            env[key] = value
            done[key] = value
    return done


def gcsfs_options(environ: MutableMapping[str, str] | None = None) -> dict:
    """Keyword arguments for `gcsfs.GCSFileSystem`: anonymous against an emulator; never a
    listings cache (several processes write one model_dir, and a cached listing would hide
    their objects)."""
    options: dict = {"use_listings_cache": False}
    if emulator_endpoint(environ):
        options["token"] = "anon"
    return options
