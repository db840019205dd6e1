"""Unmodified kubectl asks the simulated apiserver's RBAC: ``auth can-i`` (access reviews),
``--as`` (impersonation), Forbidden errors as kubectl prints them, RBAC objects by command."""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from rgpu_kubesim import SimApiServer

pytestmark = [pytest.mark.anyio, pytest.mark.process]

Kubectl = Callable[..., Awaitable[tuple[int, str, str]]]
AS_ALICE = ("--as", "alice", "--as-group", "kubesim:users")


@pytest.fixture
def kubectl(sim: SimApiServer, tmp_path: Path) -> Kubectl:
    """kubectl with a throwaway kubeconfig, cache and HOME: (exit code, stdout, stderr)."""
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("kubectl is not on PATH; `make tools` installs it (apt-get install kubectl)")
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\n")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(config)}
    base = [binary, f"--server={sim.url}", f"--kubeconfig={config}", f"--cache-dir={tmp_path}/c"]

    async def run(*args: str) -> tuple[int, str, str]:
        done = await anyio.run_process([*base, *args], env=env, check=False)
        return done.returncode, done.stdout.decode().strip(), done.stderr.decode().strip()

    return run


async def test_auth_can_i_answers_yes_or_no_with_the_exit_code(kubectl: Kubectl) -> None:
    assert await kubectl("auth", "can-i", "create", "pods") == (0, "yes", "")
    assert (await kubectl("auth", "can-i", "create", "pods", *AS_ALICE))[:2] == (0, "yes")
    code, answer, _ = await kubectl("auth", "can-i", "create", "priorityclasses", *AS_ALICE)
    assert (code, answer) == (1, "no")
    in_system = await kubectl("auth", "can-i", "get", "pods", "-n", "kube-system", *AS_ALICE)
    assert in_system[:2] == (1, "no")
    token = ("create", "serviceaccounts", "--subresource=token", "-n", "default", *AS_ALICE)
    assert (await kubectl("auth", "can-i", *token))[:2] == (1, "no")
    assert (await kubectl("auth", "can-i", "get", "/healthz", *AS_ALICE))[:2] == (0, "yes")


async def test_auth_can_i_list_shows_the_rules_of_the_users_namespace(kubectl: Kubectl) -> None:
    code, table, errors = await kubectl("auth", "can-i", "--list", "-n", "default", *AS_ALICE)
    assert code == 0, errors
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert "create" in rows["pods"] and "delete" in rows["pods"]
    assert "selfsubjectaccessreviews.authorization.k8s.io" in rows


async def test_a_forbidden_request_prints_kubes_message(kubectl: Kubectl) -> None:
    code, _, errors = await kubectl("get", "pods", "--as", "mallory")
    assert code == 1
    assert errors == (
        'Error from server (Forbidden): pods is forbidden: User "mallory" cannot list resource '
        '"pods" in API group "" in the namespace "default"'
    )


async def test_rbac_objects_are_created_and_listed_by_command(
    kubectl: Kubectl, sim: SimApiServer
) -> None:
    created = await kubectl("create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob")
    assert created[:2] == (0, "rolebinding.rbac.authorization.k8s.io/bob-view created"), created
    assert (await kubectl("auth", "can-i", "list", "pods", "--as", "bob"))[:2] == (0, "yes")
    assert (await kubectl("auth", "can-i", "create", "pods", "--as", "bob"))[:2] == (1, "no")
    code, table, errors = await kubectl("get", "clusterroles")
    assert code == 0, errors
    names = {line.split()[0] for line in table.splitlines()[1:]}
    assert {"cluster-admin", "admin", "edit", "view"} <= names
    code, table, errors = await kubectl("get", "rolebindings")
    assert table.splitlines()[0].split() == ["NAME", "ROLE", "AGE"], errors
    assert any(line.split()[:2] == ["bob-view", "ClusterRole/view"] for line in table.splitlines())
