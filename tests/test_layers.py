"""The layer contract of DESIGN.md holds: each layer of ``helpers`` imports only the layers below it, the core
imports no side room (``helpers.ecosystem``, ``helpers.serve``, ``helpers.lab``), and no module imports another
in a circle. The contracts are written once, in pyproject.toml ([tool.importlinter]), for import-linter
(``lint-imports``), which reads every import statement, at file level and inside functions."""

import pytest
from importlinter.cli import lint_imports

from helpers.paths import ROOT

SIDE_ROOMS = {"helpers.ecosystem", "helpers.serve", "helpers.lab"}


def test_import_contracts_hold():
    exit_code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    assert exit_code == 0, "an import breaks the layer contract or makes a cycle: run `lint-imports` for the details"


def test_every_core_module_is_forbidden_the_side_rooms():
    """The forbidden contract names every top-level module of ``helpers`` that is not a side room: a new core
    module cannot slip past the rule "the core imports no side room" by being left out of the list."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib comes with Python 3.11")
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    forbidden = next(c for c in contracts if c["type"] == "forbidden")
    assert set(forbidden["forbidden_modules"]) == SIDE_ROOMS
    top_level = {f"helpers.{path.stem if path.is_file() else path.name}" for path in (ROOT / "helpers").iterdir()
                 if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()}
    assert set(forbidden["source_modules"]) == top_level - SIDE_ROOMS
