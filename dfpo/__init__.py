"""dfpo: token gradient cancellation in group-relative RL fine-tuning (arXiv 2604.13088).

The public API is the shared loss core::

    from dfpo import policy_loss, group_advantages, OBJECTIVES

Everything else lives in sub-packages: ``dfpo.theory`` (claims ledger), ``dfpo.toy``
(tabular softmax lab), ``dfpo.trainer`` (loss core and LLM trainer), ``dfpo.app``
(Streamlit explorer).
"""

from importlib.metadata import PackageNotFoundError, version

from dfpo.trainer.loss import OBJECTIVES, ObjectiveSpec, group_advantages, policy_loss, resolve_objective

try:
    __version__ = version("dfpo")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "OBJECTIVES",
    "ObjectiveSpec",
    "group_advantages",
    "policy_loss",
    "resolve_objective",
    "__version__",
]
