"""Placeholder for ``sgl_kernel.utils``: importable; its kernels raise when called."""

from sgl_kernel._missing import missing_getattr

__getattr__ = missing_getattr(__name__)
