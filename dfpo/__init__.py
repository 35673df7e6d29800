"""dfpo: token gradient cancellation in group-relative RL fine-tuning (arXiv 2604.13088).

The public API is the shared loss core::

    from dfpo import policy_loss, group_advantages, OBJECTIVES, register_objective
    from dfpo import fused_policy_loss  # the LM head and the loss in one pass (hidden states in, loss out)

Everything else lives in sub-packages: ``dfpo.core`` (the shared core: loss, log-probs, metrics,
settings, statistics), ``dfpo.theory`` (claims ledger), ``dfpo.toy`` (tabular softmax lab),
``dfpo.trainer`` (LLM trainer), ``dfpo.app`` (Streamlit explorer), ``dfpo.integrations`` (TRL, verl).

The names are resolved on first use (PEP 562 ``__getattr__``): ``import dfpo.core.files`` or the reward
workers' ``import dfpo.trainer.rewards.compute`` do not import torch, and ``dfpo --help`` starts without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dfpo._lazy import lazy_attributes

if TYPE_CHECKING:  # what static tools see; at run time __getattr__ imports them on first use
    from dfpo.core.fused import fused_policy_loss
    from dfpo.core.logprobs import token_logprobs
    from dfpo.core.loss import OBJECTIVES, ObjectiveSpec, group_advantages, policy_loss, register_objective, resolve_objective

# public name -> the module that defines it
_LAZY = {
    "OBJECTIVES": "dfpo.core.loss",
    "ObjectiveSpec": "dfpo.core.loss",
    "fused_policy_loss": "dfpo.core.fused",
    "group_advantages": "dfpo.core.loss",
    "policy_loss": "dfpo.core.loss",
    "register_objective": "dfpo.core.loss",
    "resolve_objective": "dfpo.core.loss",
    "token_logprobs": "dfpo.core.logprobs",
}
# sub-packages reachable as attributes after a bare ``import dfpo`` (as when this file imported the loss core)
_SUBMODULES = ("app", "cli", "commands", "core", "integrations", "theory", "toy", "trainer")

__all__ = [
    "OBJECTIVES",
    "ObjectiveSpec",
    "fused_policy_loss",
    "group_advantages",
    "policy_loss",
    "register_objective",
    "resolve_objective",
    "token_logprobs",
    "__version__",
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # deferred: only --version and __version__ read it

    try:
        return version("dfpo")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0+unknown"


__getattr__, __dir__ = lazy_attributes(globals(), _LAZY, _SUBMODULES, computed={"__version__": _version})
