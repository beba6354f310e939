"""Entry point of `bazel run //datatasks:inspect` (see cairn.datatasks.inspect)."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from cairn.datatasks.inspect import main

if __name__ == "__main__":
    sys.exit(main())
