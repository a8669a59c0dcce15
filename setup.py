"""Install coreinv from settings.ini (nbdev's template imports pkg_resources, which fails here)."""
from configparser import ConfigParser
from pathlib import Path

from setuptools import find_packages, setup

cfg = ConfigParser(delimiters=["="])
cfg.read(Path(__file__).parent / "settings.ini", encoding="utf-8")
s = cfg["DEFAULT"]

setup(
    name=s["lib_name"],
    version=s["version"],
    description=s["description"],
    author=s["author"],
    license=s["license"],
    python_requires=">=" + s["min_python"],
    packages=find_packages(include=[s["lib_path"], s["lib_path"] + ".*"]),
    install_requires=s["requirements"].split(),
    extras_require={"dev": s["dev_requirements"].split()},
    include_package_data=True,
    zip_safe=False,
)
