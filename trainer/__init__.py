"""The shared loss core (``dfpo.trainer.loss``), chunked per-token log-probs (``token_logprobs``)
and the LLM trainer (``dfpo.trainer.llm``)."""

from dfpo.trainer.logprobs import token_logprobs

__all__ = ["token_logprobs"]
