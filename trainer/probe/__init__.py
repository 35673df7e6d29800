"""The probe (``dfpo probe``, ``log.param_drift``): how one optimiser step moves shared tokens and equivalent answers
in parameter space, split into its causes (``dfpo.core.probe.probe_step``).

Modules:
    cli.py       ``dfpo probe``'s arguments (imports stay light: every ``dfpo`` command imports it)
    command.py   the command's work, its choices written out: run the plan, write probe.json / .md / .png
    plan.py      what to probe (labels, matched controls, seeds, config), every input checked before any work
    one_seed.py  one seed: its policy, one rollout batch, pi_old and pi_ref, every objective's step from one point
    seeds.py     every seed in order, each stored under OUT/seeds/ as it ends; the document probe.json holds
    report.py    probe.md from that document
    figure.py    probe.png from that document
    stage.py     the same split inside a training run: the trial step of ``log.param_drift`` (``drift/*``)
    findings.py  the sentences docs/probe.md, cancellation.md and attribution.md hold, generated from the stored
                 documents in docs/probe/

This file holds the one setting both ``cli`` and ``command`` read, so neither imports the other for it; it imports
nothing.
"""

DEFAULT_OBJECTIVES = "gspo,dfpo_min,gspo_noclip,dfpo_min:stopgrad=score"
"""The README's matched pairs: GSPO and DFPO Min-Replace at GSPO's clip range, unclipped GSPO and score-form DFPO."""
