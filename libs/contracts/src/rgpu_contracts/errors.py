"""One error type for every wire contract, so callers catch one thing.

Hierarchy::

    ValueError
     └── ContractError      a JSON value does not match a contract (path + reason)

``ContractError`` subclasses ``ValueError`` because a malformed payload *is* a bad value;
HTTP edges turn it into a 400 whose message names the offending path and the fix.
"""

from __future__ import annotations

__all__ = ["ContractError"]


class ContractError(ValueError):
    """Raised by every ``from_dict``/decoder when input does not match the contract.

    ``path`` is a JSON-pointer-like location (``containers[1].count``), ``reason`` says what
    was wrong and, where it helps, what would be right.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path or '<root>'}: {reason}")

    def __reduce__(self) -> tuple[type[ContractError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))
