"""Placeholders for kernels the stand-in does not implement.

SGLang imports many ``sgl_kernel`` names at module load, including kernels
that CPU serving never calls (CUDA attention, quantized GEMMs, ...). Those
imports must succeed; only an actual call should fail, loudly and by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn


class MissingKernel:
    """Importable stand-in for an unimplemented kernel; calling it raises.

    Attribute access yields further placeholders so module-level expressions
    such as ``scalar_types.uint4b8`` evaluate at import time.
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(self._name)

    def __getattr__(self, attr: str) -> "MissingKernel":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return MissingKernel(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<MissingKernel {self._name}>"


def missing_getattr(module_name: str) -> Callable[[str], MissingKernel]:
    """Build a module-level ``__getattr__`` that hands out placeholders.

    Dunder names still raise AttributeError so the import system and tools
    probing ``__path__``, ``__version__`` etc. behave normally.
    """

    def __getattr__(name: str) -> MissingKernel:
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return MissingKernel(f"{module_name}.{name}")

    return __getattr__
