"""Kubernetes ``Status`` bodies for every failure the simulator reports.

kube-apiserver's errors have a precise shape (message wording, reason, details.kind being the
plural resource for storage errors but the Kind for validation errors). Clients branch on these
fields, so each builder here reproduces one apimachinery constructor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery._resources import Resource

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Cause:
    """One field-level cause of an Invalid error (apimachinery's field.Error)."""

    field: str
    reason: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.detail, "field": self.field}

    def render(self) -> str:
        return f"{self.field}: {self.detail}"


def reason_for(code: int) -> str:
    """The Status reason kube uses for an HTTP code (Unknown for unusual codes)."""
    return _REASONS.get(code, "Unknown")


def status_body(
    code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A failure Status dict; ``reason`` defaults from the code, empty reason is omitted."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
    body["status"] = "Failure"
    body["message"] = message
    chosen = reason_for(code) if reason is None else reason
    if chosen:
        body["reason"] = chosen
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def success(details: dict[str, Any] | None = None, *, code: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
    body["status"] = "Success"
    if details is not None:
        body["details"] = details
    if code is not None:
        body["code"] = code
    return body


def resource_details(resource: Resource, name: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.plural
    details.update(extra)
    return details


def failure(code: int, message: str, **kwargs: Any) -> ApiError:
    return ApiError(status_body(code, message, **kwargs))


def bad_request(message: str) -> ApiError:
    return failure(400, message)


def not_found(resource: Resource, name: str) -> ApiError:
    message = f'{resource.qualified} "{name}" not found'
    return failure(404, message, details=resource_details(resource, name))


def route_not_found() -> ApiError:
    return failure(404, "the server could not find the requested resource", details={})


def method_not_allowed() -> ApiError:
    message = "the server does not allow this method on the requested resource"
    return failure(405, message, details={})


def already_exists(resource: Resource, name: str) -> ApiError:
    message = f'{resource.qualified} "{name}" already exists'
    return failure(409, message, reason="AlreadyExists", details=resource_details(resource, name))


def conflict(resource: Resource, name: str, why: str, *, qualified: str | None = None) -> ApiError:
    """apimachinery NewConflict: 'Operation cannot be fulfilled on <res> "<name>": <why>'."""
    label = qualified or resource.qualified
    details = resource_details(resource, name)
    if qualified is not None:
        details["kind"] = qualified
    return failure(
        409, f'Operation cannot be fulfilled on {label} "{name}": {why}', details=details
    )


def modified_conflict(resource: Resource, name: str) -> ApiError:
    why = (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    return conflict(resource, name, why)


def precondition_conflict(
    resource: Resource, namespace: str, name: str, field: str, wanted: str, actual: str
) -> ApiError:
    """The storage-layer precondition failure kube reports for delete and binding."""
    key = f"/registry/{resource.plural}/{namespace + '/' if namespace else ''}{name}"
    why = (
        f"StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, "
        f"AdditionalErrorMsg: Precondition failed: {field} in precondition: {wanted}, "
        f"{field} in object meta: {actual}"
    )
    return conflict(resource, name, why)


def invalid(label: str, name: str, causes: Iterable[Cause], details: dict[str, Any]) -> ApiError:
    """apimachinery NewInvalid: one cause inline, several in brackets."""
    causes = tuple(causes)
    rendered = ", ".join(c.render() for c in causes)
    joined = rendered if len(causes) == 1 else f"[{rendered}]"
    details = {**details, "causes": [c.to_dict() for c in causes]}
    return failure(422, f'{label} "{name}" is invalid: {joined}', details=details)


def invalid_object(resource: Resource, name: str, causes: Iterable[Cause]) -> ApiError:
    """Validation failure as the strategies report it: labelled by Kind (``Pod "x"``)."""
    label = f"{resource.kind}.{resource.group}" if resource.group else resource.kind
    details: dict[str, Any] = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.kind
    return invalid(label, name, causes, details)


def invalid_storage(resource: Resource, name: str, causes: Iterable[Cause]) -> ApiError:
    """Storage-layer validation failure, labelled by qualified resource (``leases.<group>``)."""
    return invalid(resource.qualified, name, causes, resource_details(resource, name))


def name_mismatch(in_body: str, in_url: str) -> ApiError:
    return bad_request(
        f"the name of the object ({in_body}) does not match the name on the URL ({in_url})"
    )


def undecodable(resource: Resource, why: str) -> ApiError:
    """A body that cannot be decoded as the resource's kind (kube's decoding error)."""
    kind = resource.kind
    return bad_request(
        f'{kind} in version "{resource.version}" cannot be handled as a {kind}: {why}'
    )


def expired(message: str) -> ApiError:
    return failure(410, message)


def too_old(requested: int, oldest: int) -> ApiError:
    return expired(f"too old resource version: {requested} ({oldest})")


def too_large(requested: int, current: int) -> ApiError:
    details = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    message = f"Too large resource version: {requested}, current: {current}"
    return failure(504, message, details=details)


def unsupported_media_type(accepted: Iterable[str]) -> ApiError:
    message = (
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted)
    )
    return failure(415, message)


def patch_rejected(why: str) -> ApiError:
    """A JSON patch that does not apply: kube's NewGenericServerResponse(422)."""
    details = {"causes": [{"reason": "UnexpectedServerResponse", "message": why}]}
    message = "the server rejected our request due to an error in our request"
    return failure(422, message, details=details)


def internal(message: str) -> ApiError:
    text = f"Internal error occurred: {message}"
    return failure(500, text, details={"causes": [{"message": message}]})
