"""The fake lupine servers, the fleet generator and the certificate
writer fail on bad input or busy addresses, and callers (tests, the demo, ``python -m
rgpu_kubesim``) should catch one documented family instead of ``OSError``/``KeyError`` guesses.

Hierarchy (under the package's ``errors.KubesimError``)::

    KubesimError
     └── SimSetupError                 base: the simulated fleet could not be set up as asked
          ├── SimOptionError           (+ ValueError) an argument is out of range; names it
          ├── LupineNotFound           (+ LookupError) no fake lupine with that endpoint/name
          └── AddressUnavailable       (+ OSError) an address/port cannot be bound

Every message names the offending field or address and says what would be accepted.
"""

from __future__ import annotations

from rgpu_kubesim.errors import KubesimError

__all__ = ["AddressUnavailable", "LupineNotFound", "SimOptionError", "SimSetupError"]


class SimSetupError(KubesimError):
    """Base of every error raised while building fake lupine servers, fleets or certificates."""


class SimOptionError(SimSetupError, ValueError):
    """Raised when an option (mode, fault, GPU uuid, fleet size, share…) is invalid.

    ``field`` names the option as the caller spelled it, so a CLI can point at the flag.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")

    def __reduce__(self) -> tuple[type[SimOptionError], tuple[str, str]]:
        return (type(self), (self.field, self.reason))


class LupineNotFound(SimSetupError, LookupError):
    """Raised by ``LupineFleet`` lookups when no running fake server matches."""


class AddressUnavailable(SimSetupError, OSError):
    """Raised when a fake lupine server cannot listen on its address and port.

    Usually the port is taken by another process, or the address is not a local one.
    """
