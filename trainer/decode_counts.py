"""CPU proxies of a decode step's cost on an accelerator: reads back to the host, and operations dispatched.

On a GPU a decode step of a small model is bound by the host: every read back (``.item()``, ``.tolist()``,
``bool()`` / ``int()`` / ``float()`` of a tensor, ``.cpu()``, ``.numpy()``) waits for the device, and every
operation is a kernel launch. Neither needs a GPU to count:

- ``count_host_reads()`` counts the calls of those tensor methods while it is active (on any device, the CPU
  included, where they cost nothing and so are easy to add by accident);
- ``DispatchCounter`` is a ``TorchDispatchMode`` that counts the aten operations dispatched, split into those inside
  a module's forward (the model's own) and the rest (the sampler's: warpers, the draw, buffer writes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
"""Tensor methods that copy a value back to the host (and so, on an accelerator, wait for it)."""


@contextmanager
def count_host_reads() -> Iterator[Counter]:
    """Count the calls of ``HOST_READS`` methods on tensors while active: yields a Counter of method name -> calls."""
    counts: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(name, original):
        def read(self, *args, **kwargs):
            counts[name] += 1
            return original(self, *args, **kwargs)

        return read

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counted(name, original))
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


class DispatchCounter(TorchDispatchMode):
    """Counts aten operations dispatched while active: ``model`` inside ``watch(module)``'s forward, ``other`` outside.

    ``watch`` puts hooks on the module, so the split holds through any number of calls."""

    def __init__(self):
        super().__init__()
        self.model, self.other, self.depth = Counter(), Counter(), 0
        self._hooks = []

    def watch(self, module: torch.nn.Module) -> DispatchCounter:
        def enter(*_):
            self.depth += 1

        def leave(*_):
            self.depth -= 1

        self._hooks += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
        return self

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        (self.model if self.depth else self.other)[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))
