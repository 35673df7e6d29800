"""What the project says about parameter-space drift, generated from stored ``dfpo probe`` documents (never typed).

The documents live in ``docs/probe/`` (small JSON, committed): for each question a discovery set and a confirmation
set on disjoint seeds, written by the commands ``STORED`` names. ``findings_block`` turns them into the markdown list
that docs/probe.md, docs/cancellation.md and docs/attribution.md hold (``scripts/update_readme.py``): only what both
sets agree on is written (``dfpo.core.drift_tables.replication``). This is the one place those sentences come from,
so they can move into a findings ledger as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core.drift_tables import findings_markdown
from ...core.probe import OLD_RULE, document_rule

STORED = (
    (
        "Shared tokens, tiny preset (add task)",
        "add-discovery.json",
        "add-confirmation.json",
    ),
    (
        "Equivalent answers, tiny preset (equiv task, 300 warm-start steps)",
        "equiv-discovery.json",
        "equiv-confirmation.json",
    ),
    (
        "Shared tokens under the peers' losses of issue 30, tiny preset (add task)",
        "peer-losses-discovery.json",
        "peer-losses-confirmation.json",
    ),
    (
        "Shared tokens under a KL term and online IPO (reference log-probs), tiny preset (add task)",
        "ref-terms-discovery.json",
        "ref-terms-confirmation.json",
    ),
    (
        "Shared tokens and equivalent answers, SmolLM2-135M-Instruct before training (sum task)",
        "smollm2-discovery.json",
        "smollm2-confirmation.json",
    ),
)
"""(title, discovery document, confirmation document) in ``docs/probe/``. Re-make them with (add task)
``dfpo probe --seeds 8 --first-seed 0 --out runs/probe-d`` and ``--first-seed 100`` (confirmation); the equiv task
adds ``--set data.task=equiv --set model.sft_steps=300``; the peers' losses add ``--objectives
topr,kimi15,dro,vapo_nll,dapo,gpg``; the reference terms are ``dfpo probe --objectives grpo,grpo:beta=0.04,online_ipo
--seeds 8`` and ``--first-seed 100``; SmolLM2 is ``dfpo probe --config configs/smollm2-cpu.toml --seeds 8 --first-seed 0
--max-events 8 --set threads=1`` and ``--first-seed 100`` (9 to 28 min a seed at one thread on the 2-core machine
beside other work, most of it the equivalent pairs' gradients; it stores each seed and goes on after a stop);
copy each probe.json to the name above. The tiny preset's stored ones predate the subset
rule (``dfpo.core.probe.EVENT_RULES``): their shared events are the whole-group ones (``titled`` says so), and a
re-made one would probe eq 2's subset events instead (on the add task's seed 0: 58 found, 11 of them whole-group)."""


def load_stored(folder: Path) -> list[tuple[str, dict, dict]]:
    """(title, discovery, confirmation) of every ``STORED`` pair; ValueError naming a missing or overlapping file."""
    out = []
    for title, disc, conf in STORED:
        docs = []
        for name in (disc, conf):
            path = folder / name
            if not path.is_file():
                raise ValueError(f"no stored probe document {path}: re-make it with the command in dfpo.trainer.probe.findings.STORED")
            docs.append(json.loads(path.read_text()))
        shared = sorted(set(docs[0]["seeds"]) & set(docs[1]["seeds"]))
        if shared:
            raise ValueError(f"{disc} and {conf} share seeds {shared}: a confirmation set must be disjoint from its discovery set")
        out.append((title, docs[0], docs[1]))
    return out


def titled(title: str, discovery: dict, confirmation: dict) -> str:
    """A pair's title, with the shared-event rule named where its documents hold shared events picked by the old
    whole-group rule (no ``shared_events`` field: ``dfpo.core.probe.OLD_RULE``), so a reader knows they are not the
    subset events a new ``dfpo probe`` takes."""
    docs = (discovery, confirmation)
    holds = any(r["kind"] == "shared" and r.get("events", 0) > 0 for d in docs for r in d["records"])
    if holds and all(document_rule(d) == OLD_RULE for d in docs):
        return f"{title}; whole-group shared events, as stored before the probe took eq 2's subset events"
    return title


def findings_block(folder: Path) -> str:
    """The replicated findings of every stored pair, as markdown."""
    return findings_markdown([(titled(*pair), pair[1], pair[2]) for pair in load_stored(folder)])


REAL_MODEL = "smollm2"
"""The stored pair of the real model (``STORED``'s documents REAL_MODEL-discovery.json and -confirmation.json) and its
log.param_drift runs across training (``across``: REAL_MODEL-drift.json, figure docs/figures/REAL_MODEL-drift.png)."""


def real_model_block(folder: Path, figure: str) -> str:
    """docs/trainer.md's paragraph on the probe of SmolLM2, generated from the stored documents: the events each
    seed set's batches held, the replicated findings, and log.param_drift across training with its figure."""
    from . import across  # deferred: it reads run logs through dfpo.trainer.compare (numpy)
    from .command import events_sentence  # deferred: torch

    at = [disc for _, disc, _ in STORED].index(f"{REAL_MODEL}-discovery.json")
    title, disc, conf = load_stored(folder)[at]
    drift = json.loads((folder / f"{REAL_MODEL}-drift.json").read_text(encoding="utf-8"))
    minutes = f"{disc['wall_s'] / 60:.0f} and {conf['wall_s'] / 60:.0f} min"
    return "\n".join(
        [
            f"Before any training step, the probe on the pretrained model ({minutes} for the two seed sets on this machine, "
            "beside other work):",
            "",
            f"- discovery set: {events_sentence(disc)} {pairs_sentence(disc)}",
            f"- confirmation set: {events_sentence(conf)} {pairs_sentence(conf)}",
            findings_markdown([(titled(title, disc, conf), disc, conf)]),
            "",
            f"Across training (`{drift['command']}` for each objective): {across.summary_sentence(drift)}",
            "",
            f"![log.param_drift on SmolLM2-135M-Instruct: direct, cross, momentum, decay and measured change of shared events at each probed step, per objective]({figure})",
        ]
    )


def pairs_sentence(doc: dict) -> str:
    """In how many of a probe document's seeds the batch held an equivalent pair (two correct answers of a group with
    different tokens), from its records."""
    seeds = {r["seed"] for r in doc["records"] if r["kind"] == "equivalent" and r.get("events", 0) > 0}
    return f"Equivalent pairs: in {len(seeds)} of {len(doc['seeds'])} seeds' batches."
