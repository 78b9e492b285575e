"""Packages of the wheel (metadata lives in pyproject.toml).

The repository keeps conf/, results/paper/ and results/validation/ at its top level; the
wheel carries them as the packages specscale._conf, specscale._paper and
specscale._validation (specscale/resources.py finds either), so an installed harness
composes the same configs, reports against the same paper numbers and scores under the
same validation protocol as a checkout. Only the protocol of results/validation/ is
shipped: its looks.csv is the checkout's record.
"""
from setuptools import find_namespace_packages, find_packages, setup

DATA_PACKAGES = {"specscale._conf": "conf", "specscale._paper": "results/paper",
                 "specscale._validation": "results/validation"}

setup(
    # hydra_plugins is Hydra's namespace package for plugins (the skip-done sweeper): no
    # __init__.py of its own, so only its subpackage is listed.
    packages=find_packages(include=["specscale*", "analysis*", "runners*"]) + list(DATA_PACKAGES)
    + find_namespace_packages(include=["hydra_plugins.*"]),
    package_dir=DATA_PACKAGES,
    package_data={
        "specscale._conf": ["*.yaml", "**/*.yaml"],
        "specscale._paper": ["*.csv", "*.md"],
        "specscale._validation": ["protocol.yaml"],
        "specscale.data": ["fixtures/*.jsonl"],
        "specscale.engine.torch.model.configs": ["*.json"],
        # weights/{generator,prm}: model=testbed; weights/levels/{generator,prm}: model=testbed_levels
        "specscale.testbed": ["weights/*.json", "weights/*/*.json", "weights/*/*.jinja", "weights/*/*.safetensors",
                              "weights/*/*/*.json", "weights/*/*/*.jinja", "weights/*/*/*.safetensors"],
        "runners": ["*.sh"],
    },
)
