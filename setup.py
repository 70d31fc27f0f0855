"""Builds the native CPU kernels (cffi) as part of `pip install`; metadata lives in pyproject.toml."""
from setuptools import setup

setup(cffi_modules=["native/cpu/build.py:ffibuilder"])
