"""probe.md: what ran, the per-objective tables, the matched-control table and the generated warnings, from the
document probe.json holds (``seeds.run_probe``). The numbered choices (choice 2, ...) are those of ``dfpo.trainer.probe.command``'s docstring.
"""

from __future__ import annotations

import statistics

from ...core.drift_tables import MIN_SEEDS, SHARES, comparison_table, first_order_flags, share_table, summary_table
from ...core.loss import objective_from_label
from ...core.probe import OLD_RULE, RULE_WORDS, document_rule


def events_sentence(doc: dict) -> str:
    """probe.md's line on which shared events were probed, and how many the rule found before the cap per seed."""
    if document_rule(doc) == OLD_RULE:
        return (
            f"Shared events: the whole-group rule ({RULE_WORDS[OLD_RULE]}): this document has no shared_events field, so "
            "it was made before the subset rule; how many were found before the cap is not recorded."
        )
    found: dict[int, tuple[int, int]] = {}
    for r in doc["records"]:
        if r["kind"] == "shared" and "found" in r:
            found[r["seed"]] = (int(r["found"]), int(r.get("found_whole", 0)))
    counts = [n for n, _ in found.values()]
    whole = [w for _, w in found.values()]
    if not counts:
        return f"Shared events: the subset rule ({RULE_WORDS['subset']})."
    return (
        f"Shared events: the subset rule ({RULE_WORDS['subset']}); "
        f"found in a seed's batch before the cap of {doc['max_events']}: median {statistics.median(counts):g} "
        f"(min {min(counts)}, max {max(counts)}, {len(counts)} seeds), of which held by the whole group: median "
        f"{statistics.median(whole):g} (min {min(whole)}, max {max(whole)})."
    )


def render_markdown(doc: dict) -> str:
    """probe.md: what ran, the per-objective table, the matched-control table, warnings."""
    s = doc["settings"]
    seeds = doc["seeds"]
    where = f"the checkpoint of {doc['run']}" if doc["run"] else f"the {s['model']} model on {s['task']}"
    out = [
        "# Parameter-space drift probe",
        "",
        f"`{doc['command']}`" if doc["command"] else "",
        "",
        f"Seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}); {where}; one batch of {s['prompts_per_step']} groups of {s['group_size']} per seed, "
        f"{doc['move_steps']} optimiser steps of `{doc['objectives'][0]}` off pi_old, then each objective's own AdamW step "
        f"(lr {s['lr']:g}, clip {s['max_grad_norm']:g}) from that one point; at most {doc['max_events']} events of each kind.",
        *_inputs_sentence(doc),
        "",
        events_sentence(doc),
        "",
        "Per event, the first-order change of log pi (predicted = <g_e, Delta theta>, Delta theta the real update) in four "
        "parts that add up to it: direct = what the event's own coefficients cause through its own gradient, cross = what "
        "the rest of this batch's gradient causes through shared parameters, momentum = what the optimiser's state from "
        "the earlier steps carries (AdamW's first moment after the move steps; 0 on a first step), decay = weight decay's "
        "part; measured = the change after the step (a forward pass); error = abs(measured - predicted), error / abs "
        "measured = its ratio (flagged above the first-order limit). Shares are of the first-order prediction: sum abs "
        "part / sum over the four parts of sum abs part; 'cross of batch' = sum abs cross / (sum abs direct + sum abs "
        "cross), the cross term's share of the batch's own gradient's part. Shared events: as the line above says; equivalent: the log-odds of two correct completions of a group with different tokens.",
        "",
        "## Per objective (mean over seeds [95% Student-t interval over seeds])",
        "",
        summary_table(doc),
        *_flags(doc),
        "",
        "### Shares of the first-order prediction (same seeds)",
        "",
        summary_table(doc, SHARES),
        "",
        "## Against the matched control (paired over seeds)",
        "",
        comparison_table(doc),
        "",
        "## How much of the first-order prediction the cross term carries",
        "",
        share_table(doc),
    ]
    if len(seeds) < MIN_SEEDS:
        out += ["", f"Warning: {len(seeds)} seeds (fewer than {MIN_SEEDS}): the intervals are wide and lean on near-normal differences."]
    return "\n".join(out) + "\n"


def _flags(doc: dict) -> list[str]:
    """probe.md's generated first-order warnings under the table (``drift_tables.first_order_flags``); [] when none."""
    flags = first_order_flags(doc)
    return ["", *(f"Warning: {f}" for f in flags)] if flags else []


def _inputs_sentence(doc: dict) -> list[str]:
    """probe.md's line on pi_ref and pi_rollout, when some label reads them (choices 4 and 5); [] otherwise."""
    specs = [objective_from_label(label) for label in doc["objectives"]]
    out = []
    if any(spec.needs_ref_logp for spec in specs):
        ref = f"the reference model of {doc['run']}" if doc["run"] else "the starting policy"
        out.append(f"pi_ref: {ref}, frozen, scored on the batch before any step.")
    if any(spec.needs_rollout_logp for spec in specs):
        source = doc["settings"].get("old_logp", "recompute")
        out.append(f"pi_rollout: the sampler's per-token log-probs; pi_old as rollout.old_logp={source} makes it in training.")
    return ["", " ".join(out)] if out else []
