"""Set-up is quiet: the package metadata builds without setuptools' deprecation warnings (issue 25)."""

from __future__ import annotations

import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_metadata_builds_without_deprecation_warnings(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # license-files are relative to the project
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message) for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"  # an SPDX expression, not a TOML table
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
