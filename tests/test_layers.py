"""The layer contract of DESIGN.md holds: each layer of ``helpers`` imports only the layers below it, and no
module imports another in a circle. The contracts are written once, in pyproject.toml ([tool.importlinter]),
for import-linter (``lint-imports``), which reads every import statement, at file level and inside functions."""

from importlinter.cli import lint_imports

from helpers.paths import ROOT


def test_import_contracts_hold():
    exit_code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    assert exit_code == 0, "an import breaks the layer contract or makes a cycle: run `lint-imports` for the details"
