"""Packages of the wheel (metadata lives in pyproject.toml).

The repository keeps conf/ and results/paper/ at its top level; the wheel carries them
as the packages specscale._conf and specscale._paper (specscale/resources.py finds
either), so an installed harness composes the same configs and reports against the
same paper numbers as a checkout.
"""
from setuptools import find_namespace_packages, find_packages, setup

DATA_PACKAGES = {"specscale._conf": "conf", "specscale._paper": "results/paper"}

setup(
    # hydra_plugins is Hydra's namespace package for plugins (the skip-done sweeper): no
    # __init__.py of its own, so only its subpackage is listed.
    packages=find_packages(include=["specscale*", "analysis*", "runners*"]) + list(DATA_PACKAGES)
    + find_namespace_packages(include=["hydra_plugins.*"]),
    package_dir=DATA_PACKAGES,
    package_data={
        "specscale._conf": ["*.yaml", "**/*.yaml"],
        "specscale._paper": ["*.csv", "*.md"],
        "specscale.data": ["fixtures/*.jsonl"],
        "specscale.engine.torch.model.configs": ["*.json"],
        "specscale.testbed": ["weights/*/*.json", "weights/*/*.jinja", "weights/*/*.safetensors", "weights/*.json"],
        "runners": ["*.sh"],
    },
)
