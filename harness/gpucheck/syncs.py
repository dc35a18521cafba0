"""Host synchronizations counted by the thread that caused them, under torch.cuda.set_sync_debug_mode("warn")
(which warns "called a synchronizing CUDA operation" on each).

DDP calls comm hooks from the thread that runs backward's hooks: on a GPU, autograd's device thread, not the
main thread. So `SyncCounter.wrap(hook)` records every thread that calls the hook, and marks the time inside
each call. Counted as "hook": inside a hook call for any bucket but the step's last (the hook promises none
there); "last bucket": inside the last bucket's call (which the hook runs inline, by design: nothing of
backward is left to overlap); "backward": elsewhere on a thread that ran backward (the main thread, where
autograd also replays the warnings of its own C++ threads, or a thread that called the hook); "lane": a Zen
communication lane (threads named zen-comm-*); anything else by its thread's name.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from harness.gpucheck.table import require

SYNC_MESSAGE = "synchronizing CUDA operation"
LANE_PREFIX = "zen-comm"


class SyncCounter:
    """Counts sync warnings by where they came from (see the module docstring)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        # threads, not their idents: an ended thread's ident is reused by the next one
        self._backward: weakref.WeakSet[threading.Thread] = weakref.WeakSet([threading.main_thread()])
        self._call = threading.local()
        self._lock = threading.Lock()
        self._forward: Callable[..., Any] = warnings.showwarning

    def wrap(self, hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """`hook`, recording its callers' threads and the time inside each call. The wrapper carries no
        annotations: DDP's register_comm_hook rejects string annotations."""

        def counted(state, bucket):  # no annotations: see the docstring
            with self._lock:
                self._backward.add(threading.current_thread())
            self._call.kind = "last bucket" if bucket.is_last() else "hook"
            try:
                return hook(state, bucket)
            finally:
                self._call.kind = None

        return counted

    def where(self) -> str:
        """Where the calling thread is, in the counts' terms."""
        kind = getattr(self._call, "kind", None)
        if kind:
            return kind
        thread = threading.current_thread()
        if thread.name.startswith(LANE_PREFIX):
            return "lane"
        return "backward" if thread in self._backward else thread.name

    def _record(self, message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        if SYNC_MESSAGE in str(message):
            where = self.where()
            with self._lock:
                self.counts[where] += 1
        else:
            self._forward(message, category, *args, **kwargs)

    @contextmanager
    def counting(self) -> Iterator[SyncCounter]:
        """Count every sync warning of every thread inside the block (warnings' filters and display are
        process-wide, which is what lets another thread's warnings reach the counter)."""
        self._forward = warnings.showwarning
        warnings.showwarning = self._record
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                yield self
        finally:
            warnings.showwarning = self._forward


def judge_syncs(counts: dict[str, int]) -> str:
    """The sync check: no host synchronization inside a hook call for any bucket but the last (backward's
    thread would wait there for every kernel queued so far). Returns the detail; CheckFailed otherwise."""
    fixed = ("hook", "last bucket", "lane", "backward")
    others = {k: v for k, v in counts.items() if k not in fixed and isinstance(v, int)}
    detail = (f"in hook calls {counts.get('hook', 0)}, in the last bucket's (inline) {counts.get('last bucket', 0)}, "
              f"on lanes {counts.get('lane', 0)}, backward's own {counts.get('backward', 0)}"
              + "".join(f", {k} {v}" for k, v in sorted(others.items())))
    require(counts.get("hook", 0) == 0, f"host syncs inside hook calls on backward's thread: {detail}")
    return detail
