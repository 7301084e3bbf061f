"""The ways forming a job can fail: one RendezvousError subclass each, every message naming what to check."""

from __future__ import annotations


class RendezvousError(RuntimeError):
    """The job could not be formed; the message names the address, the ranks and what to check."""


class RendezvousAddressError(RendezvousError):
    """The rendezvous host does not resolve, or this host has no route or interface to it."""


class RendezvousPortInUseError(RendezvousError):
    """Rank 0 cannot bind the rendezvous port: another job or program holds it."""


class RendezvousBindError(RendezvousError):
    """Rank 0 cannot bind the rendezvous address for another reason (not one of rank 0's addresses)."""


class RendezvousConnectionError(RendezvousError):
    """This worker could not reach the rendezvous within the bound."""


class RendezvousOtherJobError(RendezvousError):
    """The rendezvous on this port belongs to another job."""


class RendezvousAuthError(RendezvousError):
    """The rendezvous refused this worker's signature: another secret, or a clock too far off."""


class RendezvousConflictError(RendezvousError):
    """The ranks disagree: two processes claim one rank, or the ranks were told different sizes."""


class RendezvousProtocolError(RendezvousError):
    """The server on the rendezvous port is not an hvdkeras rendezvous."""


class RendezvousTimeoutError(RendezvousError):
    """Some ranks never joined within the bound."""


class RendezvousSizeError(RendezvousError):
    """Horovod formed a job of another size than the launcher started (Horovod was initialized elsewhere)."""
