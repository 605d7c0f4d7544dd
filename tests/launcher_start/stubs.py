"""Stand-ins for packages a launcher imports at module load that its start-up checks never call
(GPU kernels, data loaders, loggers, tokenizers): the runners of this folder install them before
importing the launcher, each runner naming its own."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import types


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (_Any,), {})


class _Any(metaclass=_Meta):
    """Whatever a module-level use of a stubbed package asks for: a decorator returns its
    function, anything else another stand-in."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and callable(a[0]) and not k else _Any()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any()

    def __getitem__(self, key):
        return _Any()


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (_Any,), {})


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: tuple[str, ...]):
        self.names = names

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        # tensorboard's version gate in torch.utils.tensorboard; triton's is never consulted
        # (torch looked for triton before the stub was in place)
        module.__version__ = "2.20.0"


def install(names: tuple[str, ...]) -> None:
    """Stub `names` (top-level packages). torch looks for triton once, at import: it is imported
    first, so it finds none and keeps its CPU paths."""
    import sys

    import torch._dynamo
    import torch._inductor.runtime.triton_compat
    import torch.utils.flop_counter  # noqa: F401

    sys.meta_path.insert(0, _Stubs(names))
