"""`.ci/check-layers` (run by `make lint`): a module of a service or of rgpu_placement that its
package's layers contract leaves out fails the check, named with its file and the contract to
edit. Each case builds a small repository of its own and runs the script's `main` on it."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    path = ROOT / ".ci" / "check-layers"
    loader = importlib.machinery.SourceFileLoader("check_layers", str(path))
    spec = importlib.util.spec_from_loader("check_layers", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


check_layers = _script()

CONTRACTS = """\
[importlinter]
root_packages =
    rgpu_demo
    rgpu_placement

[importlinter:contract:demo-layers]
name = demo layers
type = layers
layers =
    rgpu_demo.app
{demo}

[importlinter:contract:placement-layers]
name = placement layers
type = layers
layers =
    rgpu_placement._choosing : rgpu_placement._fitting
"""


def repository(
    root: Path, *, demo: str = "    rgpu_demo.routes | rgpu_demo.rules\n    rgpu_demo.errors"
) -> Path:
    """A repository with one service (app, routes, rules, errors) and
    placement, under the contracts above with ``demo`` as the service's lower layers."""
    files = [
        "services/demo/src/rgpu_demo/__init__.py",
        "services/demo/src/rgpu_demo/app.py",
        "services/demo/src/rgpu_demo/routes.py",
        "services/demo/src/rgpu_demo/rules.py",
        "services/demo/src/rgpu_demo/errors.py",
        "libs/placement/src/rgpu_placement/__init__.py",
        "libs/placement/src/rgpu_placement/_choosing.py",
        "libs/placement/src/rgpu_placement/_fitting.py",
    ]
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('"""A module."""\n')
    (root / ".importlinter").write_text(CONTRACTS.format(demo=demo))
    return root


def run(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = check_layers.main(["--root", str(root)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_passes_when_every_module_is_in_a_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run(repository(tmp_path), capsys)

    assert code == 0, out
    assert "all 6 modules" in out


def test_fails_on_a_module_left_out_naming_it_its_file_and_the_contract(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = repository(tmp_path, demo="    rgpu_demo.routes\n    rgpu_demo.errors")

    code, out = run(root, capsys)

    assert code == 1
    assert "services/demo/src/rgpu_demo/rules.py: module rgpu_demo.rules is in no layer" in out
    assert "[importlinter:contract:demo-layers] in .importlinter" in out
    assert "rgpu_demo.routes " not in out


def test_fails_on_a_new_placement_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = repository(tmp_path)
    (root / "libs/placement/src/rgpu_placement/_ranking.py").write_text('"""New."""\n')

    code, out = run(root, capsys)

    assert code == 1
    assert "module rgpu_placement._ranking is in no layer" in out
    assert "[importlinter:contract:placement-layers]" in out


def test_fails_on_a_new_kubesim_module_outside_its_rooms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = repository(tmp_path)
    kubesim = root / "libs/kubesim/src/rgpu_kubesim"
    (kubesim / "apiserver").mkdir(parents=True)
    for name in ("__init__.py", "apiserver/__init__.py", "apiserver/_storage.py", "_gossip.py"):
        (kubesim / name).write_text('"""A module."""\n')
    config = root / ".importlinter"
    rooms = "type = layers\nlayers =\n    rgpu_kubesim.apiserver\n"
    config.write_text(f"{config.read_text()}\n[importlinter:contract:kubesim-layers]\n{rooms}")

    code, out = run(root, capsys)

    assert code == 1
    assert "rgpu_kubesim/_gossip.py: module rgpu_kubesim._gossip is in no layer" in out
    assert "[importlinter:contract:kubesim-layers]" in out
    assert "rgpu_kubesim.apiserver._storage is" not in out


def test_a_sub_package_named_in_a_layer_covers_its_modules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layers = ("rgpu_demo.routes : rgpu_demo.rules", "rgpu_demo.store", "rgpu_demo.errors")
    root = repository(tmp_path, demo="\n".join(f"    {layer}" for layer in layers))
    store = root / "services/demo/src/rgpu_demo/store"
    store.mkdir()
    (store / "__init__.py").write_text('"""Storage."""\n')
    (store / "leases.py").write_text('"""Leases."""\n')

    code, out = run(root, capsys)

    assert code == 0, out


def test_a_module_of_a_sub_package_left_out_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = repository(tmp_path)
    store = root / "services/demo/src/rgpu_demo/store"
    store.mkdir()
    (store / "__init__.py").write_text('"""Storage."""\n')
    (store / "leases.py").write_text('"""Leases."""\n')

    code, out = run(root, capsys)

    assert code == 1
    assert "module rgpu_demo.store is in no layer" in out
    assert "module rgpu_demo.store.leases is in no layer" in out


def test_layers_named_relative_to_their_containers_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = repository(tmp_path)
    config = root / ".importlinter"
    config.write_text(
        config.read_text().replace(
            "layers =\n    rgpu_demo.app\n",
            "containers = rgpu_demo\nlayers =\n    app\n    (routes) | rules\n    errors\n",
        )
    )

    code, out = run(root, capsys)

    assert code == 0, out


def test_fails_on_a_service_without_a_layers_contract(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = repository(tmp_path)
    other = root / "services/other/src/rgpu_other"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text('"""Another service."""\n')

    code, out = run(root, capsys)

    assert code == 1
    assert "package rgpu_other has no layers contract" in out
    assert "[importlinter:contract:other-layers]" in out


def test_the_repository_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(ROOT, capsys)

    assert code == 0, out
