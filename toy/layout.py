"""The files of a toy run folder (``dfpo toy run / ablate / spread / sweep-g --out DIR``), named once.

Standard library only, so the explorer reads toy folders without torch. (An LLM run folder is
``dfpo.trainer.run.layout.RunDir``.)
"""

from __future__ import annotations

CONFIG = "config.json"
"""The settings the run was made with; its presence marks the folder as a toy run (``--force`` to overwrite)."""
METRICS = "metrics.jsonl"
"""One line per objective, seed and step."""
METRICS_MEAN = "metrics_mean.csv"
"""The means over seeds, one row per objective and step."""
SUMMARY = "summary.md"
"""The tables and the paper's checks, as printed."""
OVERVIEW = "overview.png"
"""Every curve of the run on one figure."""
SPREAD = "spread.json"
"""``dfpo toy spread``: one row per swept value."""
