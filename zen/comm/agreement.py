"""The communicator's agreement: every backend call guarded (a failure poisons the communicator and every later
call raises ZenCommError naming the first), headers compared (misaligned calls, other schemes or layouts raise on
every rank that sees them), and the fixed all-gather every agreement travels in (the input check, sizes of a dense
all-reduce, the shared seed)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from zen.comm.wire import FIXED_SLOTS, FIXED_VALUES, META, Message, code_of, layout_code
from zen.types import Traffic, ZenCommError, ZenInputError

T = TypeVar("T")


class Agreement:
    """The part of zen.comm.base.Communicator that keeps ranks in step (see the module docstring); the state
    and backend primitive it uses are the Communicator's."""

    rank: int
    world_size: int
    device: torch.device
    traffic: Traffic
    call: int
    _code: int
    _sizes_agreed: bool
    _failure: str | None
    _seed: int | None
    _seed_proposal: int | None
    _all_gather: Callable[[torch.Tensor], torch.Tensor]

    # ---- host reads ----------------------------------------------------------------------------
    def host(self, tensor: torch.Tensor) -> list[Any]:
        """`tensor` as Python numbers: this layer's only read of (possibly device) data, counted once per
        call as a host read (on a GPU: a wait for this thread's stream)."""
        self.traffic.host_reads += 1
        return tensor.tolist()


    # ---- guarded execution -------------------------------------------------------------------
    def _poison(self, why: str) -> ZenCommError:
        if self._failure is None:
            self._failure = why
            self._on_failure()
        return ZenCommError(why)

    def _on_failure(self) -> None:  # noqa: B027 - a hook with nothing to do by default
        """What a backend does when the communicator fails (NCCL: abort, so no kernel waits forever)."""

    def _guard(self, what: str, phase: str, fn: Callable[[], T]) -> T:
        if self._failure is not None:
            raise ZenCommError(f"rank {self.rank}/{self.world_size}: {what} in phase '{phase}' refused: this "
                               f"communicator failed earlier ({self._failure}); re-create the process group")
        try:
            return fn()
        except ZenCommError as exc:
            raise self._poison(str(exc)) from exc
        except Exception as exc:  # backend errors: dead peer, timeout, broken barrier
            raise self._poison(
                f"rank {self.rank}/{self.world_size}: {what} in phase '{phase}' failed "
                f"(dead or missing peer, timeout, or ranks calling different collectives): {exc}"
            ) from exc

    def _agree(self, heads: list[list[int]], ranks: list[int], what: str, fatal: bool = False) -> None:
        """Raise, alike on every rank that sees the same headers, unless [call, code, layout] agree. `fatal`
        (a point-to-point header, which only the receiver sees): any disagreement poisons."""
        calls, codes, layouts = ([h[k] for h in heads] for k in range(3))
        where = f"rank {self.rank}/{self.world_size}: {what}"
        if fatal and (len(set(calls)) > 1 or len(set(codes)) > 1 or len(set(layouts)) > 1):
            raise self._poison(f"{where}: rank {ranks[1]} sent a message of another call, scheme or layout "
                               f"(call, code, layout: {heads[1]} here {heads[0]}); re-create the process group")
        if len(set(calls)) > 1:
            raise self._poison(f"{where}: calls are misaligned (ranks {ranks} are at calls {calls}): a rank "
                               f"skipped or added a call; re-create the process group")
        if len(set(codes)) > 1:
            raise ZenInputError(f"zen: {where}: ranks {ranks} run different schemes, options or validate "
                                f"settings in call {calls[0]} (codes {codes})")
        if len(set(layouts)) > 1:
            raise ZenInputError(f"zen: {where}: ranks {ranks} send different dtypes or row shapes in call "
                                f"{calls[0]}")

    def _stamp(self, template: Message) -> list[int]:
        """A message header's first slots: this call's number and code, and the message's layout."""
        return [self.call, self._code, layout_code(template)]

    def _header_rows(self, row: list[int], like: Message, source: int, phase: str) -> list[int]:
        """The row counts in rank `source`'s message header `row`, once its call, code and layout agree with ours."""
        self._agree([self._stamp(like), row[:3]], [self.rank, source], f"exchange in phase '{phase}'", fatal=True)
        return row[3 : 3 + len(like)]

    def _same_layouts(self, layouts: set[int], phase: str) -> None:
        """Raise, on every rank that sees the same layouts, unless every rank's all_gather_v message has one."""
        if len(layouts) > 1:
            raise ZenInputError(f"zen: rank {self.rank}/{self.world_size}: all_gather_v in phase '{phase}': ranks "
                                f"send different dtypes or row shapes in call {self.call}")


    def _agree_size(self, tensor: torch.Tensor) -> None:
        """Unless the call's sizes are agreed: all ranks show each other the tensor's size and dtype first
        (a fixed all-gather), since gloo aborts a process whose all-reduce meets one of another size."""
        if not self._sizes_agreed:
            table = self.all_gather_fixed([tensor.numel(), code_of(str(tensor.dtype))])
            if len({tuple(row) for row in table}) > 1:
                raise ZenInputError(f"zen: rank {self.rank}/{self.world_size}: all_reduce of tensors that differ "
                                    f"across ranks (numel, dtype code per rank: {table})")


    def all_gather_fixed(self, values: torch.Tensor | Sequence[int], phase: str = META,
                         dtype: torch.dtype = torch.int64) -> list[list[Any]]:
        """All-gather of up to FIXED_VALUES 8-byte values per rank (as many on every rank): every rank's
        values, as Python numbers of `dtype` (int64 or float64), in rank order. `values` may be a device
        tensor (counts a scheme has not read yet): the gathered table is read once, on the host. It travels
        as one FIXED_SLOTS header (call, code, n, values), whatever n is."""
        if isinstance(values, torch.Tensor):
            tensor = values.reshape(-1)
            if tensor.element_size() != 8:
                raise ValueError(f"all_gather_fixed takes 8-byte values, got {tensor.dtype}")
            tensor = tensor.view(torch.int64)
        else:
            tensor = torch.tensor(list(values), dtype=torch.int64)
        n = int(tensor.numel())
        if n > FIXED_VALUES:
            raise ValueError(f"all_gather_fixed takes at most {FIXED_VALUES} values, got {n}")
        head = torch.zeros(FIXED_SLOTS, dtype=torch.int64)
        head[:3] = torch.tensor([self.call, self._code, n])
        head = head.to(self.device)
        head[3 : 3 + n] = tensor.to(self.device)
        if self.world_size == 1:
            table = head.view(1, -1)
        else:
            table = self._guard("all_gather", phase, lambda: self._all_gather(head))
            nbytes = (self.world_size - 1) * FIXED_SLOTS * 8
            self.traffic.add(phase, nbytes, nbytes)
        self.traffic.rounds += 1
        rows = self.host(table)
        self._agree([row[:3] for row in rows], list(range(self.world_size)), f"all_gather in phase '{phase}'")
        if dtype == torch.int64:
            return [row[3 : 3 + n] for row in rows]
        return torch.tensor([row[3 : 3 + n] for row in rows], dtype=torch.int64).view(dtype).tolist()

    def shared_seed(self) -> int:
        """A seed every rank agrees on (rank 0's proposal), fetched once per communicator."""
        if self._seed is None:
            proposal = self._seed_proposal
            if proposal is None:
                proposal = random.SystemRandom().getrandbits(62)
            self._seed = int(self.all_gather_fixed([proposal], phase="setup")[0][0])
        return self._seed

