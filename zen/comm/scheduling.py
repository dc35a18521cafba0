"""An opt-in scheduling tweak for gloo's event-loop threads on machines with fewer cores than ranks.

Why: a thread posting a gloo send or receive holds its pair's lock, and gloo's loop only try-locks a pair and
calls epoll_wait again when that fails, so an EPOLLIN that arrives meanwhile makes it spin. With more ranks
than cores the holder is often preempted right then, by another rank's loop woken by the bytes it just wrote,
and the spinning loops take CPU the ranks need. A SCHED_BATCH thread still
runs at normal weight but does not preempt on wake-up. Linux only. It changes the scheduling policy of
threads of the calling process, so the library never applies it on its own: the harness's ranks do
(harness.launch, and the hook with `gloo_batch=True`), ZEN_GLOO_BATCH=0 turning it off there.
"""

from __future__ import annotations

import os
from pathlib import Path

GLOO_LOOP_THREAD = "gloo_tcp_loop"  # the name gloo gives its TCP event-loop thread


def _gloo_loop_threads() -> list[int]:
    tasks = Path("/proc/self/task")
    if not hasattr(os, "sched_setscheduler") or not tasks.is_dir():
        return []
    found = []
    for task in tasks.iterdir():
        try:
            if (task / "comm").read_text().strip() == GLOO_LOOP_THREAD:
                found.append(int(task.name))
        except OSError:  # the thread has ended
            continue
    return found


def calm_gloo_event_loop() -> int:
    """Put this process's gloo event-loop threads under SCHED_BATCH; returns how many now are.

    Why: see the module docstring (gloo's loops spin on a pair whose lock a preempted sender holds). Linux
    only."""
    calmed = 0
    for tid in _gloo_loop_threads():
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            calmed += 1
        except OSError:  # the thread ended, or the policy is not ours to change: keep the default
            continue
    return calmed


def calm_gloo(backend: str) -> None:
    """`calm_gloo_event_loop` on gloo unless ZEN_GLOO_BATCH=0. Every process group has event loops of its own,
    started under the default policy, so a rank that makes groups later (two-level sync) calls it again."""
    if backend == "gloo" and os.environ.get("ZEN_GLOO_BATCH", "1") != "0":
        calm_gloo_event_loop()


def gloo_loop_policy() -> str:
    """"batch" or "default": the scheduling policy of this process's gloo event loop; "-" without one."""
    threads = _gloo_loop_threads()
    if not threads:
        return "-"
    try:
        batch = all(os.sched_getscheduler(t) == os.SCHED_BATCH for t in threads)
    except OSError:
        return "-"
    return "batch" if batch else "default"
