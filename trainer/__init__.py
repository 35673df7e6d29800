"""The shared loss core (``dfpo.trainer.loss``) and the LLM trainer (``dfpo.trainer.llm``)."""
