"""The shared loss core (``dfpo.trainer.loss``), chunked per-token log-probs (``token_logprobs``)
and the LLM trainer (``dfpo.trainer.llm``).

``token_logprobs`` is resolved on first use (PEP 562 ``__getattr__``), so importing a light submodule
(``dfpo.trainer.llm.rewards`` in a reward worker, ``dfpo.trainer.llm.cli`` for ``dfpo --help``) does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what static tools see; at run time __getattr__ imports it on first use
    from dfpo.trainer.logprobs import token_logprobs

_LAZY = {"token_logprobs": "dfpo.trainer.logprobs"}
# sub-packages reachable as attributes after a bare ``import dfpo.trainer``
_SUBMODULES = ("llm", "logprobs", "loss", "metric_registry", "metrics")

__all__ = ["token_logprobs"]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})
