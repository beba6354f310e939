"""`RowIndex`: the deterministic reader's first stage, which planned records make each of this
host's rows at a step.

Global row `r` of step `s` is `s * global_batch_size + j`. The mixture's schedule (`mixing`)
gives its task and the cursor in that task's stream; the task's stream
(`TaskStream.planned`: its read order and packing plan, `permutation`, `chunk_order`, `plan`)
gives the records. With a chunk order, each global batch's rows are sorted by (task, first
record) before hosts take their slices (`read_order.sort_rows`): a host then reads the same few
chunks of a window at every step, whatever the host count. Host `h` of `H` owns rows
`j in [h * B / H, (h + 1) * B / H)`.

A pure function of the step: the index holds no position (the batching stage does). Its state,
in Grain's manner, is what shapes its rows: `get_state` records it (the seed, the global batch
size, a first-fit packing window, a chunk order) and `set_state` refuses a state saved by an
index of other rows, naming what differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cairn.datatasks.deterministic.mixing import MixtureSchedule
from cairn.datatasks.deterministic.read_order import sort_rows
from cairn.datatasks.errors import DataTasksError


class RowIndex:
    """(step, this host's row) -> (task, planned records), for the reader's task streams."""

    def __init__(
        self,
        streams: Sequence[Any],
        schedule: MixtureSchedule,
        seed: int,
        global_batch_size: int,
        per_host: int,
        first_row: int,
        packing_window: int,
        orders: Sequence[tuple[str, int]],
        shuffle_window: int,
    ):
        self.streams = list(streams)
        self.schedule = schedule
        self.seed, self.batch = int(seed), int(global_batch_size)
        self.per_host, self.first_row = int(per_host), int(first_row)
        # 0: greedy (what a state without the key means); the window of a first-fit plan.
        self.packing_window = int(packing_window)
        self.orders = list(orders)  # per task: (shuffle, records per order chunk)
        self.shuffle_window = shuffle_window
        self.sorted_rows = any(mode == "chunks" for mode, _ in self.orders)

    # -- state ---------------------------------------------------------------------
    def order_state(self) -> dict[str, int | str]:
        """The read order as `get_state` records it: nothing for "global" (as before the
        option existed), else `shuffle`, `shuffle_chunk` and `shuffle_window` (with tasks of
        different orders, `shuffle` names the chunked tasks and `shuffle_chunk` is per task)."""
        chunked = [(s.task.name, c) for s, (m, c) in zip(self.streams, self.orders) if m == "chunks"]
        if not chunked:
            return {}
        sizes = {c for _, c in chunked}
        return {
            "shuffle": "chunks" if len(chunked) == len(self.streams) else ",".join(n for n, _ in chunked),
            "shuffle_chunk": sizes.pop() if len(sizes) == 1 else ",".join(f"{n}:{c}" for n, c in chunked),
            "shuffle_window": self.shuffle_window,
        }

    def get_state(self) -> dict[str, int | str]:
        """What shapes the rows: `seed`, `global_batch_size`, `packing_window` (first-fit
        only) and the chunk order (`order_state`)."""
        state: dict[str, int | str] = {"seed": self.seed, "global_batch_size": self.batch}
        if self.packing_window:
            state["packing_window"] = self.packing_window
        state.update(self.order_state())
        return state

    def set_state(self, state: Mapping[str, int | str]) -> None:
        """Refuses (`DataTasksError`) a state saved by an index of other rows; keys it does not
        record (the batching stage's `step`) are not its."""
        for k in ("seed", "global_batch_size"):
            if k in state and int(state[k]) != getattr(self, "seed" if k == "seed" else "batch"):
                raise DataTasksError(
                    f"state has {k}={state[k]}, this reader was built with {self.seed if k == 'seed' else self.batch}"
                )
        window = int(state.get("packing_window", 0))
        if window != self.packing_window:

            def what(w: int) -> str:
                return f"packing='first_fit', packing_window={w}" if w else "packing='greedy'"

            raise DataTasksError(
                f"state was saved by a reader with {what(window)}; this "
                f"reader has {what(self.packing_window)}: its rows differ"
            )
        ours = self.order_state()
        theirs = {k: state[k] for k in ("shuffle", "shuffle_chunk", "shuffle_window") if k in state}
        if theirs != ours:

            def order(o: Mapping[str, int | str]) -> str:
                return ", ".join(f"{k}={v!r}" for k, v in o.items()) if o else "shuffle='global'"

            raise DataTasksError(
                f"state was saved by a reader with {order(theirs)}; this reader has {order(ours)}: its rows differ"
            )

    # -- rows ----------------------------------------------------------------------
    def assigned(self, step: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(task index, cursor in that task's stream) of this host's rows at the steps
        `step .. step + count - 1`, step by step."""
        steps = (step + np.arange(count, dtype=np.int64))[:, None] * self.batch
        if not self.sorted_rows:
            return self.schedule.assign((steps + self.first_row + np.arange(self.per_host)[None, :]).reshape(-1))
        tasks, cursors = self.schedule.assign((steps + np.arange(self.batch)[None, :]).reshape(-1))
        first = np.empty_like(cursors)
        for t in np.unique(tasks).tolist():
            where = np.nonzero(tasks == t)[0]
            _, records, sizes = self.streams[t].planned(cursors[where])
            first[where] = records[np.cumsum(sizes) - sizes]
        order = sort_rows(tasks, first, self.batch).reshape(count, self.batch)
        mine = order[:, self.first_row : self.first_row + self.per_host].reshape(-1)
        return tasks[mine], cursors[mine]

    def row_records(self, step: int, count: int = 1) -> list[tuple[str, int, np.ndarray]]:
        """`(task name, epoch, record ids)` of each of this host's rows at steps
        `step .. step + count - 1`, step by step."""
        tasks, cursors = self.assigned(step, count)
        out: list = [None] * len(tasks)
        for t in np.unique(tasks):
            where = np.nonzero(tasks == t)[0]
            stream = self.streams[int(t)]
            for w, (e, ids) in zip(where.tolist(), stream.rows(cursors[where])):
                out[w] = (stream.task.name, e, ids)
        return out
