"""Communicator layer: the only place where bytes cross ranks, and where they are counted."""

from zen.comm.base import Communicator, Message
from zen.comm.dist import DistComm
from zen.comm.sim import SimComm, SimGroup

__all__ = ["Communicator", "DistComm", "Message", "SimComm", "SimGroup"]

