"""The wheel carries what an installed odelm needs: every package's ``py.typed`` and every
data file under the packages (the grids of ``odelm compare --preset``), as setup.cfg's
package_data names them; the type check's file list names modules that exist.
(.ci/run builds the wheel, installs it in a fresh venv and runs it.)"""

from __future__ import annotations

import configparser
from fnmatch import fnmatchcase

from tests.support.paths import ROOT

PACKAGES = ("odelm", "neuralode_lm", "ode_transformer", "experiments")


def setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def package_data() -> dict[str, list[str]]:
    """setup.cfg's package_data: package -> its file patterns."""
    section = setup_cfg()["options.package_data"]
    return {
        key: [p.strip() for p in value.split(",") if p.strip()] for key, value in section.items()
    }


def matches(relative: str, pattern: str) -> bool:
    """Whether setuptools' glob ``pattern`` (``*`` within one folder) names ``relative``."""
    parts, wanted = relative.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(map(fnmatchcase, parts, wanted))


def test_every_package_ships_py_typed():
    data = package_data()
    for package in PACKAGES:
        assert (ROOT / package / "py.typed").is_file(), package
        assert "py.typed" in data.get(package, []), f"package_data of {package} lacks py.typed"


def test_package_data_names_every_data_file():
    data = package_data()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(ROOT / package).as_posix()
            assert any(matches(relative, p) for p in data.get(package, [])), (
                f"{package}/{relative} would be left out of the wheel: add it to package_data"
            )
    assert matches("configs/grids/quick.yaml", "configs/*/*.yaml")
    assert not matches("configs/grids/extra/x.yaml", "configs/*/*.yaml")


def test_mypy_checks_modules_that_exist():
    files = [f.strip() for f in setup_cfg()["mypy"]["files"].split(",") if f.strip()]
    assert "odelm" in files and "experiments/evaluation/trained.py" in files
    for name in files:
        assert (ROOT / name).exists(), f"setup.cfg [mypy] files names a missing {name}"
