"""The compressor contract: what a DDP part's gradient becomes before a scheme synchronizes it.

A natural-sparsity gradient (an embedding table's) is synchronized as it is; a dense one has nothing for a
sparse scheme to skip. A *sparsifier* chooses a few elements per part (top-k, DGC, random-k) and keeps what
it left out as a residual that is added back next step (error feedback), so nothing is lost, only delayed.
The part's buffer is overwritten with exactly the chosen gradient (zeros elsewhere) and the chosen
(ids, values) are handed to the scheme as its rows, so every scheme, dense or sparse, synchronizes exactly
what the compressor chose, and Zen stays lossless relative to it. A *quantizer*'s codes cannot be summed in
their encoding, so it brings its own exchange (an all-gather of codes, as GRACE's allgather communicator).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable
from typing import ClassVar

import torch

from zen.comm.base import Communicator
from zen.grad import LocalGrad
from zen.output import Output
from zen.registry import Scheme
from zen.route import Flat, PartContext
from zen.types import PhaseBytes, SyncStats, WireLayout, ZenInputError


class Compressor(ABC):
    """One compressor: options fixed at construction, per-part state (residuals) keyed by `PartContext.key`.

    `density` is the share of a part's elements a sparsifier keeps (a quantizer ignores it)."""

    name: ClassVar[str]
    own_exchange: ClassVar[bool] = False  # True: its codes travel by their own all-gather (`Quantized`), not the scheme

    def __init__(self, density: float = 0.05) -> None:
        if not 0 < density <= 1:
            raise ZenInputError(f"compressor density must be in (0, 1], got {density}")
        self.density = density
        self.memory: dict[Hashable, torch.Tensor] = {}
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """This compressor's random stream on `device` (seeded by its `seed` option): draws happen where the
        tensor is, and the training RNG is left alone."""
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(getattr(self, "seed", 0))
        return self._generators[device]

    @property
    def config(self) -> str:
        """Name and options: what every rank must agree on (part of the hook's call code)."""
        options = sorted((k, v) for k, v in vars(self).items() if v is None or isinstance(v, bool | int | float | str))
        return f"{self.name}{options}"

    def prune(self, keep: Iterable[Hashable]) -> None:
        """Drop the state of parts that no longer exist (DDP rebuilt its buckets)."""
        kept = set(keep)
        for key in list(self.memory):  # one atomic copy: a lane may add this step's parts meanwhile
            if key not in kept:
                del self.memory[key]

    def residual_norm(self, key: Hashable, lazy: bool = False) -> float | torch.Tensor:
        """L2 norm of what this part's compressor has not sent yet (its own error, measured). `lazy`: as a
        0-d tensor, read when someone asks (on a GPU, a read here would wait for the device)."""
        res = self.memory.get(key)
        if res is None:
            return 0.0
        return res.norm() if lazy else float(res.norm())

    def compress(self, tensor: torch.Tensor, ctx: PartContext) -> LocalGrad:
        """Overwrite `tensor` (a part, any shape) with the chosen gradient; return it as rows of width 1 with
        the chosen (ascending ids, values) already extracted."""
        flat = tensor.view(-1)
        ids, values = self.choose(self._incoming(flat, ctx), self._residual(flat, ctx), flat, ctx)
        return LocalGrad(flat.numel(), 1, flat.dtype, flat.device, dense=flat.view(-1, 1), indices=ids,
                         values=values.view(-1, 1))

    def _incoming(self, flat: torch.Tensor, ctx: PartContext) -> torch.Tensor:
        """What this step adds to the residual: the gradient itself (DGC: clipped, momentum-corrected)."""
        return flat

    def _residual(self, flat: torch.Tensor, ctx: PartContext) -> torch.Tensor:
        """This part's error-feedback buffer (zeros at first)."""
        res = self.memory.get(ctx.key)
        if res is None or res.shape != flat.shape:
            res = self.memory[ctx.key] = torch.zeros_like(flat)
        return res

    def _accumulate(self, flat: torch.Tensor, ctx: PartContext) -> torch.Tensor:
        """Error feedback: the residual plus this step's gradient, kept in the residual's buffer."""
        return self._residual(flat, ctx).add_(self._incoming(flat, ctx))

    def choose(self, src: torch.Tensor, res: torch.Tensor, flat: torch.Tensor, ctx: PartContext
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Accumulate `src` into the residual `res`, send `select`'s elements: they move to `flat` (zero
        elsewhere; `src` may be `flat`) and leave `res`. Returns the sent (ascending ids, values)."""
        return send(src, res, flat, lambda acc: self.select(acc, ctx))

    def wrap(self, inner: Scheme) -> Compressed:
        """The scheme `inner` run on this compressor's choice (a part's route, zen.route)."""
        return Compressed(self, inner)

    def keep(self, numel: int, ctx: PartContext) -> int:
        """Elements to keep of a part of `numel` (at least one)."""
        return max(1, min(numel, math.ceil(self.density * numel)))

    def select(self, acc: torch.Tensor, ctx: PartContext) -> torch.Tensor:
        """Ascending int64 ids of the elements of `acc` (the error-compensated gradient) to send; a
        sparsifier gives this or its own `choose`."""
        raise NotImplementedError(f"{self.name} chooses in its own pass")

class Quantizer(Compressor):
    """A compressor that sends every element in a code that cannot be summed as it is: its own exchange
    all-gathers the codes (phase `gather`) and every rank decodes and adds them in rank order with the
    sender's arithmetic, so the sum is exact and the same bits on every rank. A quantizer gives `quantize`
    (overwrite the part with the decoded codes, keep the rest as residual, return the codes), `decode` and
    `predict`."""

    own_exchange = True

    def compress(self, tensor: torch.Tensor, ctx: PartContext) -> LocalGrad:
        """Overwrite `tensor` with what its codes decode to; as dense rows (every element is sent)."""
        self.quantize(tensor, ctx)
        return dense_rows(tensor)

    def wrap(self, inner: Scheme) -> Compressed:
        return Quantized(self, inner)

    @abstractmethod
    def quantize(self, tensor: torch.Tensor, ctx: PartContext) -> tuple[torch.Tensor, ...]:
        """Overwrite `tensor` with what its codes decode to, keep the rest as the residual; returns the codes
        as they travel."""

    @abstractmethod
    def decode(self, codes: tuple[torch.Tensor, ...], numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The values a rank's codes stand for (what its `quantize` wrote back)."""

    @abstractmethod
    def predict(self, world_size: int, numel: int) -> dict[str, int]:
        """Bytes each rank receives per phase for one part of `numel` elements (as zen.prediction does for
        schemes)."""


def dense_rows(tensor: torch.Tensor) -> LocalGrad:
    """`tensor` as rows of width 1, every element sent."""
    return LocalGrad(tensor.numel(), 1, tensor.dtype, tensor.device, dense=tensor.view(-1, 1))


class Compressed(Flat):
    """A scheme on a compressor's choice: the part's buffer is overwritten with exactly what the compressor
    sends, and `inner` synchronizes those rows (already extracted), so the sum is exactly the ranks' choices."""

    def __init__(self, compressor: Compressor, inner: Scheme):
        super().__init__(inner)
        self.compressor = compressor

    def prepare(self, tensor: torch.Tensor, rows: bool, ctx: PartContext, comm: Communicator) -> LocalGrad:
        return compress_part(self.compressor, tensor, ctx)


class Quantized(Compressed):
    """A quantizer's codes cannot be summed in their encoding, so they do not go through `inner`: one
    all-gather of every rank's codes (phase `gather`), then every rank adds what they decode to in rank order,
    with the sender's arithmetic: exactly the sum of the ranks' quantized values, the same bits on every rank.
    One object per part and call: it holds the rank's codes from `prepare` to the exchange."""

    def __init__(self, quantizer: Quantizer, inner: Scheme):
        super().__init__(quantizer, inner)
        self.name = "gather_codes"
        self.quantizer = quantizer
        self.codes: tuple[torch.Tensor, ...] = ()

    def prepare(self, tensor: torch.Tensor, rows: bool, ctx: PartContext, comm: Communicator) -> LocalGrad:
        refuse_sparse(tensor)
        self.codes = self.quantizer.quantize(tensor, ctx)
        return dense_rows(tensor)

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        gathered = comm.all_gather_v(self.codes, phase="gather")
        flat = out.buffer.view(-1)
        flat.zero_()
        for codes in gathered:
            flat.add_(self.quantizer.decode(codes, flat.numel(), flat.dtype))

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        return [self.quantizer.predict(layout.world_size, layout.rows * layout.width) for _ in sets]


def refuse_sparse(tensor: torch.Tensor) -> None:
    if tensor.layout != torch.strided:
        raise ZenInputError("a compressor needs a dense tensor")


def compress_part(compressor: Compressor, tensor: torch.Tensor, ctx: PartContext) -> LocalGrad:
    """The compressor's choice for a part (it overwrites the part): a ZenInputError for a COO tensor."""
    refuse_sparse(tensor)
    return compressor.compress(tensor, ctx)


def sorted_ids(ids: torch.Tensor) -> torch.Tensor:
    return ids.sort().values if ids.numel() > 1 else ids


def send(src: torch.Tensor, res: torch.Tensor, flat: torch.Tensor,
         select: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulate `src` into the residual `res` and send `select(acc)`'s ids: their values move to `flat`
    (zeroed first; `src` may be `flat`) and leave `res`."""
    acc = res.add_(src)
    flat.zero_()
    return take(acc, flat, select(acc))


def take(acc: torch.Tensor, flat: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Send acc[ids]: the values move to `flat` (zero before) and leave `acc` (the residual)."""
    values = acc.index_select(0, ids)
    acc.index_fill_(0, ids, 0)
    flat.index_copy_(0, ids, values)
    return ids, values
