"""Every service answers an error with the same small JSON body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from . import _validate as v


class ErrorBodyDict(TypedDict):
    code: str
    message: str
    retryable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorBody:
    """An error as a value: ``code`` is a stable machine word, ``message`` says what and the fix."""

    code: str
    message: str
    retryable: bool = False

    def to_dict(self) -> ErrorBodyDict:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ErrorBody:
        m = v.as_mapping(raw, path)
        return cls(
            code=v.string(m, "code", path),
            message=v.string(m, "message", path),
            retryable=v.boolean(m, "retryable", path, False),
        )
