"""The shared loss core (``dfpo.trainer.loss``), chunked per-token log-probs (``token_logprobs``)
and the LLM trainer (``dfpo.trainer.llm``).

``token_logprobs`` is resolved on first use (PEP 562 ``__getattr__``), so importing a light submodule
(``dfpo.trainer.llm.rewards`` in a reward worker, ``dfpo.trainer.llm.cli`` for ``dfpo --help``) does not
import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dfpo._lazy import lazy_attributes

if TYPE_CHECKING:  # what static tools see; at run time __getattr__ imports it on first use
    from dfpo.trainer.logprobs import token_logprobs

_LAZY = {"token_logprobs": "dfpo.trainer.logprobs"}
# sub-packages reachable as attributes after a bare ``import dfpo.trainer``
_SUBMODULES = ("llm", "logprobs", "loss", "metric_registry", "metrics")

__all__ = ["token_logprobs"]


__getattr__, __dir__ = lazy_attributes(globals(), _LAZY, _SUBMODULES)
