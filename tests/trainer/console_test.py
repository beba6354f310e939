"""The console's progress line: its fixed format, one full line per interval in a file or pipe,
a line redrawn in place on a terminal with log records written around it (never garbled)."""

import io
import logging

from cairn.trainer import console as console_lib
from cairn.trainer.console import Console, duration, progress_text


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Tty(io.StringIO):
    def isatty(self):
        return True


VALUES = {
    "loss": 5.3141,
    "learning_rate": 0.01,
    "steps_per_second": 1.8,
    "tokens_per_second": 3120.0,
    "mfu": 0.412,
    "accuracy": 0.5,  # not shown
}


def test_the_line_has_a_fixed_order():
    assert progress_text(120, 600, VALUES) == (
        "step 120/600 (20%) loss 5.31 lr 1.0e-2 1.8 steps/s 3.1k tok/s MFU 41% ETA 4m27s"
    )
    assert progress_text(1, 600, {}) == "step 1/600 (0%) ETA ?"
    moe = {"moe/load_balance_loss": 2.0512, "moe/dropped_fraction": 0.03125, "moe/aux_loss": 0.02}
    assert progress_text(120, 600, {**VALUES, **moe}) == (
        "step 120/600 (20%) loss 5.31 lr 1.0e-2 moe balance 2.05 dropped 3.1% 1.8 steps/s 3.1k tok/s MFU 41% ETA 4m27s"
    )
    assert [duration(s) for s in (12, 265, 3900, float("inf"))] == ["12s", "4m25s", "1h05m", "?"]


def test_a_file_gets_one_full_line_per_interval():
    clock, out = Clock(), io.StringIO()
    console = Console(600, stream=out, interval_s=30, clock=clock)
    assert not console.update(1, VALUES)  # the first line comes one interval in
    clock.now += 30
    assert console.update(50, VALUES)
    clock.now += 10
    assert not console.update(60, VALUES)
    assert console.update(600, VALUES, force=True)  # the last step
    console.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == ["step 50/600", "step 600/600"]
    assert "\r" not in out.getvalue() and out.getvalue().endswith("\n")


def test_processes_other_than_0_show_nothing():
    out = io.StringIO()
    console = Console(10, stream=out, enabled=False, interval_s=0)
    assert not console.update(10, VALUES, force=True)
    assert out.getvalue() == ""


def test_on_a_terminal_the_line_is_redrawn_and_log_records_go_above_it(monkeypatch):
    tty, clock = Tty(), Clock()
    root = logging.getLogger()
    handler = logging.StreamHandler(tty)
    # The console reroutes the handlers that write to the terminal; here, the one writing to `tty`.
    monkeypatch.setattr(console_lib, "_writes_to_terminal", lambda h: h is handler)
    root.addHandler(handler)
    try:
        console = Console(600, stream=tty, interval_s=1, clock=clock)
        console.update(100, VALUES)
        assert handler not in root.handlers  # rerouted through tqdm.write while the line is shown
        logging.getLogger("cairn.trainer").warning("checkpoint at step 100")
        clock.now += 1
        console.update(200, VALUES)
        console.close()
        assert root.handlers.count(handler) == 1  # given back
    finally:
        root.removeHandler(handler)
    text = tty.getvalue()
    assert "\r" in text  # redrawn in place
    # Every piece between carriage returns / newlines is the log record or a whole progress line.
    pieces = [p.strip() for p in text.replace("\r", "\n").split("\n") if p.strip()]
    assert "checkpoint at step 100" in pieces
    assert all(p == "checkpoint at step 100" or p.startswith("step ") for p in pieces), pieces
    assert pieces[-1].startswith("step 200/600")
