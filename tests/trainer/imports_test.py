"""`import cairn.trainer` loads no TensorFlow; the public names exist."""

import subprocess
import sys

import cairn.trainer


def test_import_does_not_load_tensorflow():
    code = "import sys, cairn.trainer; bad = [m for m in sys.modules if m.split('.')[0] == 'tensorflow']; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_public_api():
    for name in cairn.trainer.__all__:
        assert hasattr(cairn.trainer, name), name
    assert cairn.trainer.__version__ == "0.1.0"
