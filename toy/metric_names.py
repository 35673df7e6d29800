"""Names of the toy's logged metrics that changed, for reading older run folders (imports nothing heavy:
the explorer's runs page reads toy logs without torch).

A quantity the LLM trainer logs too is logged by the toy under the trainer's name from
``dfpo.core.metric_registry``, so toy and trainer runs share their charts.
"""

RENAMED = {"reward/sampled": "reward/mean"}
"""Keys an older toy run logged under another name -> the name the toy logs today."""
