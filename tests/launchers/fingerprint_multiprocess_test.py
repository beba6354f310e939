"""The parameter checksum is a collective: 2 processes x 4 CPU devices give the checksums of
1 process x 8 devices, and only process 0 writes."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

from cairn.launchers.fingerprint import load_run

WORKER = pathlib.Path(__file__).absolute().with_name("fingerprint_worker.py")
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_workers(num_processes: int, model_dir: pathlib.Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("XLA_FLAGS", None)
    port, procs = _free_port(), []
    try:
        for pid in range(num_processes):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(WORKER),
                        str(num_processes),
                        str(pid),
                        str(port),
                        str(8 // num_processes),
                        str(model_dir),
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        deadline = time.monotonic() + TIMEOUT_S
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert p.returncode == 0, f"worker exited {p.returncode}:\n{out[-4000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_processes_checksum_like_one(tmp_path):
    _run_workers(1, tmp_path / "one")
    _run_workers(2, tmp_path / "two")
    one, two = load_run(tmp_path / "one"), load_run(tmp_path / "two")
    assert list(one.checksums) == [2, 4]
    assert one.checksums == two.checksums  # sha256, sum and abs sum
    assert one.checksums[2].param_sha256 != one.checksums[4].param_sha256
    assert one.header["process_count"] == 1 and two.header["process_count"] == 2
    lines = (tmp_path / "two" / "fingerprint" / "checksums.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4]  # process 1 wrote nothing
