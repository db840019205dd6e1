"""The CLI's apiserver client: the services' settings and connection, under its own name.

The CLI borrows a service's settings (``RGPU_KUBE_URL``, else in-cluster, else ``KUBECONFIG``)
but acts as whoever runs it, with that kubeconfig's credentials; a User-Agent of its own keeps
the simulated cluster, which takes ``rgpu-<service>`` for that service's ServiceAccount, from
authorizing ``rgpu explain`` or ``rgpu cordon`` as the extender.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from rgpu_runtime.settings import Settings

if TYPE_CHECKING:
    from rgpu_runtime.kube import KubeClient

__all__ = ["CLI_USER_AGENT", "cli_kube_client"]

CLI_USER_AGENT = "rgpu-cli"


def cli_kube_client(settings: Settings) -> AbstractAsyncContextManager[KubeClient]:
    """``kube_client`` for the apiserver ``settings`` point at, announcing the CLI."""
    # The Kubernetes client takes half a second to import: ``rgpu --help``, ``status`` and
    # ``queue`` never talk to the apiserver, so only the commands that do pay for it.
    from rgpu_runtime.kube import kube_client

    return kube_client(settings, user_agent=CLI_USER_AGENT)
