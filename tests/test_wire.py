"""A backend that reads only host memory (gloo) gets only host tensors, whatever device the payloads live on.

On a GPU with gloo, a header round used to move its headers to the device and hand them to gloo's
point-to-point sends, which read host memory. Only a GPU shows that bug, so here the payload device is
"meta" (no data, never the host) and the backend (a simulated group) refuses anything not on the host."""

from __future__ import annotations

import pytest
import torch

from zen.comm.sim import SimComm, SimGroup


class HostWire(SimComm):
    """A simulated rank whose payloads are on another device while its wire is the host, as gloo's with CUDA."""

    def _wire_device(self) -> torch.device:
        return torch.device("cpu")

    def _all_to_all(self, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
        assert send.device.type == "cpu", f"the backend was handed a {send.device} tensor"
        return super()._all_to_all(send, send_sizes, recv_sizes)


@pytest.mark.parametrize("P", [1, 3, 4])
def test_header_rounds_travel_on_the_host(P: int) -> None:
    group = SimGroup(P)
    comms = [HostWire(group, r, device="meta") for r in range(P)]

    def rank(r: int) -> list[list[float]]:
        comm = comms[r]
        comm.begin_call(1)
        rows = torch.arange(r + 2, dtype=torch.float32).view(-1, 1)
        messages = [(rows + 10 * j,) for j in range(P)]
        got = comm.all_to_all_v(messages, "push")
        return [m[0].view(-1).tolist() for m in got]

    for r, got in enumerate(group.run(rank)):
        assert got == [(torch.arange(j + 2, dtype=torch.float32) + 10 * r).tolist() for j in range(P)]
