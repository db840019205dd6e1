"""The CLI acts against the apiserver as whoever runs it, never as the service whose settings it
borrows: on the simulated cluster, which takes ``rgpu-<service>`` User-Agents for that
service's ServiceAccount, ``rgpu explain`` must not be refused what the extender may not do."""

from __future__ import annotations

import pytest

from rgpu_cli.kube import cli_kube_client
from rgpu_kubesim import ApiOptions, run_apiserver
from rgpu_runtime.errors import KubeError
from rgpu_runtime.kube import kube_client
from rgpu_runtime.settings import Settings

pytestmark = pytest.mark.anyio

EXTENDER = "system:serviceaccount:rgpu-system:rgpu-extender"


async def test_the_cli_reads_events_as_its_user_where_the_extenders_account_may_not() -> None:
    options = ApiOptions(user_agents={"rgpu-extender": EXTENDER})
    async with run_apiserver(options=options) as sim:
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="extender")
        async with cli_kube_client(settings) as kube:
            listed = await kube.call_raw(kube.core.list_namespaced_event, "default")
        assert listed["items"] == []
        assert sim.refusals.total == 0
        async with kube_client(settings) as as_extender:
            with pytest.raises(KubeError) as refused:
                await as_extender.call_raw(as_extender.core.list_namespaced_event, "default")
        assert refused.value.kube_status == 403
        assert EXTENDER in refused.value.kube_message
