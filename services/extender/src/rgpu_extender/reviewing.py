"""From the webhook's request body to its answer: refused by shape before decoding when it is
too large to be a pod rgpu schedules (``reviewshape``), then decoded and decided
(``admission``). A review refused before decoding is still answered in-band when its uid can
be read from its first bytes (the apiserver writes it there), so ``kubectl`` shows why.
"""

from __future__ import annotations

import logging

import orjson

from rgpu_contracts import admission_deny

from .admission import AdmissionPolicy, Decision, admit
from .errors import MalformedReview
from .instruments import ExtenderMetrics
from .reviewshape import leading_uid, too_many_values

__all__ = ["admit_body"]

logger = logging.getLogger(__name__)


def admit_body(
    body: bytes, policy: AdmissionPolicy, metrics: ExtenderMetrics, *, values: int | None = None
) -> Decision:
    """The decision for one AdmissionReview body; raises ``MalformedReview`` when it has no uid
    to answer with (not JSON, not v1, or refused by shape without a readable uid). ``values``
    is the body's count of JSON values when the listener counted it already."""
    refusal = too_many_values(body, values)
    if refusal is not None:
        return _refused(body, refusal, metrics)
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        metrics.webhook.labels("unknown", "malformed").inc()
        raise MalformedReview(
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    return admit(raw, policy, metrics)


def _refused(body: bytes, message: str, metrics: ExtenderMetrics) -> Decision:
    uid = leading_uid(body)
    if uid is None:
        metrics.webhook.labels("unknown", "malformed").inc()
        raise MalformedReview(message)
    metrics.webhook.labels("unknown", "denied").inc()
    logger.info("denied review %s before decoding it: %s", uid, message)
    return Decision(
        review=admission_deny(uid, message, 400),
        operation="unknown",
        allowed=False,
        outcome="denied",
        message=message,
    )
