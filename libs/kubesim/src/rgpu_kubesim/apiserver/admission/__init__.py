"""Admission: the mutating and validating webhooks and the ValidatingAdmissionPolicies
(CEL) a write passes after authorization and before storage, as kube-apiserver runs them.
"""

from __future__ import annotations

from rgpu_kubesim.apiserver.admission._admission import (
    Admission,
)
from rgpu_kubesim.apiserver.admission._admission_policy import (
    AdmissionPolicies,
)

__all__ = [
    "Admission",
    "AdmissionPolicies",
]
