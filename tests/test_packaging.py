"""Packaging: the metadata builds without setuptools' deprecation warnings, and the wheel installs one namespace."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import warnings
import zipfile
from pathlib import Path

import pytest
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


PACKAGES = ("core", "complexity", "policies", "cache", "edge_node", "cloud_pool", "gateway")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, text=True)
    (built,) = out.glob("tiergate-*.whl")
    return built


def test_the_wheel_installs_one_namespace_with_every_package_and_its_data(wheel: Path) -> None:
    """Nothing generic (`core`, `cache`, ...) at the top of site-packages; every source package and data file inside."""
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"tiergate", "tiergate-0.1.0.dist-info"}
    assert "tiergate/__init__.py" not in names  # a namespace package
    for package in PACKAGES:
        for init in (ROOT / package).rglob("__init__.py"):
            assert f"tiergate/{init.relative_to(ROOT).as_posix()}" in names, init
    for data in ("policies/default.yaml", "policies/schema.json", "policies/examples/cascade.yaml",
                 "complexity/word_vectors.npy", "complexity/complexity_model.json", "gateway/static/status.js"):
        assert f"tiergate/{data}" in names, data


def test_the_installed_wheel_adds_only_its_namespace_and_the_commands_run(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv (dependencies borrowed from this one by a path line) gets tiergate/ and its dist-info, nothing
    else, and the three console scripts start from it, not from this checkout."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # a path line: its .pth files stay unread
    before = {p.name for p in site.iterdir()}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # tests/conftest.py points it at the checkout
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                    "-q", str(wheel)], env=env, check=True, capture_output=True, text=True)
    added = {p.name for p in site.iterdir()} - before
    assert added == {"tiergate", "tiergate-0.1.0.dist-info"}
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import tiergate.gateway.app as m; print(m.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(site)
    for command, says in (("tiergate", "serve"), ("edge-node", "serve"), ("cloud-pool", "launch")):
        run = subprocess.run([str(venv / "bin" / command), "--help"], cwd=tmp_path, env=env, capture_output=True,
                             text=True)
        assert run.returncode == 0 and says in run.stdout, (command, run.stderr[-2000:])
