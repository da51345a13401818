"""A stand-in for torchvision in the SGLang lane, where no real one can load.

SGLang 0.5.23's model-config package (imported by its memory pools, so by the HiCache
controller) imports `torchvision.transforms` at module level for multimodal image
preprocessing (InternVL, DeepSeek-OCR). PyPI's torchvision is built against CUDA torch
(its `_C.so` links libtorch_cuda), so beside the CPU torch 2.13.0 it fails to import
("operator torchvision::nms does not exist"), and installing it pulls CUDA torch 2.14.1.
Nothing in the lane touches an image: where `import torchvision` fails, the lane gives SGLang
empty modules whose every attribute is a placeholder that raises if it is ever called, after
transformers has noted that torchvision is absent (so transformers never uses the stand-in).
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

MODULES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


class Absent:
    """Any attribute of the stand-in: usable as a name at import, raising when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Absent:
        return Absent(f"{self._name}.{attribute}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: torchvision is not installed in the SGLang lane")


class StandIn(types.ModuleType):
    """An empty torchvision module (see the module docstring)."""

    def __getattr__(self, attribute: str) -> Absent:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return Absent(f"{self.__name__}.{attribute}")


def install_torchvision_stand_in() -> bool:
    """Put the stand-in in place where torchvision cannot be imported; whether it did."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in MODULES:
            sys.modules.pop(name, None)
    else:
        return False
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cached: False, before the stand-in exists
    for name in MODULES:
        module = StandIn(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__path__ = []
        sys.modules[name] = module
    sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]  # type: ignore[attr-defined]
    sys.modules["torchvision.transforms"].functional = sys.modules[  # type: ignore[attr-defined]
        "torchvision.transforms.functional"
    ]
    return True
