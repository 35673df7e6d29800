"""The probe (``dfpo probe``, ``log.param_drift``): how one optimiser step moves shared tokens and equivalent answers
in parameter space, split into its causes (``dfpo.core.probe.probe_step``).

Modules:
    cli.py       ``dfpo probe``'s arguments (imports stay light: every ``dfpo`` command imports it)
    command.py   the command's work: seeds, policies, batches, every objective's step, probe.json / .md / .png
    stage.py     the same split inside a training run: the trial step of ``log.param_drift`` (``drift/*``)
    findings.py  the sentences docs/probe.md, cancellation.md and attribution.md hold, generated from the stored
                 documents in docs/probe/

This file holds the one setting both ``cli`` and ``command`` read, so neither imports the other for it; it imports
nothing.
"""

DEFAULT_OBJECTIVES = "gspo,dfpo_min,gspo_noclip,dfpo_min:stopgrad=score"
"""The README's matched pairs: GSPO and DFPO Min-Replace at GSPO's clip range, unclipped GSPO and score-form DFPO."""
