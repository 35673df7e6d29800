"""What the project says about parameter-space drift, generated from stored ``dfpo probe`` documents (never typed).

The documents live in ``docs/probe/`` (small JSON, committed): for each question a discovery set and a confirmation
set on disjoint seeds, written by the commands ``STORED`` names. ``findings_block`` turns them into the markdown list
that docs/probe.md, docs/cancellation.md and docs/attribution.md hold (``scripts/update_readme.py``): only what both
sets agree on is written (``dfpo.core.drift_tables.replication``). This is the one place those sentences come from,
so they can move into a findings ledger as they are.

Beside the replicated findings each pair's block says (``pair_notes``): on how many seeds an objective's batch gave the
probed events no gradient (so only the optimiser's state moved them, and a comparison or a share there is degenerate,
``dfpo.core.drift_tables.degenerate``), the largest first-order error of both sets, and each share that both sets put
near one half (``NEAR_HALF``) without deciding its side.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core.drift_tables import KIND_WORDS, KINDS, SHARE_TESTS, SHARE_WORDS, cross_shares, findings_markdown, values
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
    (
        "Whole-group shared tokens, SmolLM2-135M-Instruct after the template warm-up (template sum task), "
        "gspo_noclip and its exact-cancellation arm",
        "smollm2-template-discovery.json",
        "smollm2-template-confirmation.json",
    ),
)
"""(title, discovery document, confirmation document) in ``docs/probe/``. Re-make them with (add task)
``dfpo probe --seeds 8 --first-seed 0 --out runs/probe-d`` and ``--first-seed 100`` (confirmation); the equiv task
adds ``--set data.task=equiv --set model.sft_steps=300``; the peers' losses add ``--objectives
topr,kimi15,dro,vapo_nll,dapo,gpg``; the reference terms are ``dfpo probe --objectives grpo,grpo:beta=0.04,online_ipo
--seeds 8`` and ``--first-seed 100``; SmolLM2 is ``dfpo probe --config configs/smollm2-cpu.toml --seeds 8 --first-seed 0
--max-events 8 --set threads=1`` and ``--first-seed 100`` (9 to 28 min a seed at one thread on the 2-core machine
beside other work, most of it the equivalent pairs' gradients; it stores each seed and goes on after a stop);
the template task (issue 58 item 8) is ``dfpo probe --objectives gspo_noclip,gspo_noclip:cancel=shared_whole --config
configs/smollm2-template.toml --set threads=1 --max-events 8 --seeds 8 --first-seed 0`` and ``--first-seed 100``, from
the warm-up every stage-1 cell starts from; copy each probe.json to the name above. The tiny preset's stored ones predate the subset
rule (``dfpo.core.probe.EVENT_RULES``): their shared events are the whole-group ones (``titled`` says so), and a
re-made one would probe eq 2's subset events instead (on the add task's seed 0: 58 found, 11 of them whole-group)."""


def load_pair(folder: Path, title: str, disc: str, conf: str) -> tuple[str, dict, dict]:
    """(title, discovery, confirmation) of one ``STORED`` pair; ValueError naming a missing or overlapping file."""
    docs = []
    for name in (disc, conf):
        path = folder / name
        if not path.is_file():
            raise ValueError(f"no stored probe document {path}: re-make it with the command in dfpo.trainer.probe.findings.STORED")
        docs.append(json.loads(path.read_text()))
    shared = sorted(set(docs[0]["seeds"]) & set(docs[1]["seeds"]))
    if shared:
        raise ValueError(f"{disc} and {conf} share seeds {shared}: a confirmation set must be disjoint from its discovery set")
    return title, docs[0], docs[1]


def load_stored(folder: Path) -> list[tuple[str, dict, dict]]:
    """``load_pair`` of every ``STORED`` pair."""
    return [load_pair(folder, *pair) for pair in STORED]


def stored_pair(folder: Path, name: str) -> tuple[str, dict, dict]:
    """``load_pair`` of the ``STORED`` pair whose documents are NAME-discovery.json and NAME-confirmation.json."""
    (pair,) = [p for p in STORED if p[1] == f"{name}-discovery.json"]
    return load_pair(folder, *pair)


def titled(title: str, discovery: dict, confirmation: dict) -> str:
    """A pair's title, with the shared-event rule named where its documents hold shared events picked by the old
    whole-group rule (no ``shared_events`` field: ``dfpo.core.probe.OLD_RULE``), so a reader knows they are not the
    subset events a new ``dfpo probe`` takes."""
    docs = (discovery, confirmation)
    holds = any(r["kind"] == "shared" and r.get("events", 0) > 0 for d in docs for r in d["records"])
    if holds and all(document_rule(d) == OLD_RULE for d in docs):
        return f"{title}; whole-group shared events, as stored before the probe took eq 2's subset events"
    return title


NEAR_HALF = 0.25
"""A cross share is "about half" when both seed sets' adjusted intervals hold 1/2 and lie within 1/2 +- this."""


def idle_seeds(doc: dict, label: str) -> list[int]:
    """The seeds on which ``label``'s batch gave every probed event no gradient (direct and cross both 0 for each kind of
    event the seed had): only the optimiser's state from earlier steps and weight decay moved them."""
    out = []
    for seed in doc["seeds"]:
        parts = [(values(doc, label, kind, "direct").get(seed), values(doc, label, kind, "cross").get(seed)) for kind in KINDS]
        held = [(d, c) for d, c in parts if d is not None and c is not None]
        if held and all(d == 0 and c == 0 for d, c in held):
            out.append(seed)
    return out


def idle_sentence(discovery: dict, confirmation: dict) -> str:
    """Which objectives' batch gave the probed events no gradient, and on how many of both sets' seeds ('' when none)."""
    total = len(discovery["seeds"]) + len(confirmation["seeds"])
    counts = {label: len(idle_seeds(discovery, label)) + len(idle_seeds(confirmation, label)) for label in discovery["objectives"]}
    if not any(counts.values()):
        return ""
    groups: dict[int, list[str]] = {}
    for label, n in counts.items():
        groups.setdefault(n, []).append(f"`{label}`")
    parts = [f"under {' and '.join(labels)} on {n} of {total} seeds" for n, labels in sorted(groups.items(), reverse=True)]
    return (
        "The batch gave the probed events no gradient at the probed step (direct and cross both 0, so only the optimiser's "
        f"state from earlier steps and weight decay moved them) {'; '.join(parts)}."
    )


def error_sentence(discovery: dict, confirmation: dict) -> str:
    """The largest first-order error (error_ratio: mean abs(measured - predicted) over a seed's events / their mean abs
    measured change) of both sets, and where it is ('' when no record holds one)."""
    ratios = [
        (r["error_ratio"], r["objective"], r["kind"], r["seed"])
        for d in (discovery, confirmation)
        for r in d["records"]
        if "error_ratio" in r
    ]
    if not ratios:
        return ""
    worst, label, kind, seed = max(ratios)
    return (
        f"First-order error: the prediction (direct + cross + momentum + decay) misses the measured change by at most {100 * worst:.1f}% "
        f"of it (mean abs over a seed's events), on every objective, kind of event and seed of both sets (the worst: `{label}`, "
        f"{KIND_WORDS[kind]}, seed {seed})."
    )


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def half_sentences(discovery: dict, confirmation: dict) -> list[str]:
    """Each cross share that neither set puts on one side of 1/2 but both put within ``NEAR_HALF`` of it: about half."""
    out = []
    for figure in SHARE_TESTS:
        conf = {(s.objective, s.kind): s for s in cross_shares(confirmation, figure)}
        for d in cross_shares(discovery, figure):
            c = conf.get((d.objective, d.kind))
            pair = (d.interval, c.interval) if c is not None else ()
            if not pair or not all(0.5 - NEAR_HALF <= iv.low <= 0.5 <= iv.high <= 0.5 + NEAR_HALF for iv in pair):
                continue
            out.append(
                f"Under `{d.objective}` about half {SHARE_WORDS[figure]} for {KIND_WORDS[d.kind]} comes through the cross term "
                f"(the rest of the batch's gradient): {_pct(c.interval.mean)} [{_pct(c.interval.low)}, {_pct(c.interval.high)}] on the "
                f"confirmation set, {_pct(d.interval.mean)} [{_pct(d.interval.low)}, {_pct(d.interval.high)}] on the discovery set "
                f"(both intervals hold one half and lie within {_pct(0.5 - NEAR_HALF)}-{_pct(0.5 + NEAR_HALF)}; neither side replicates)."
            )
    return out


def pair_notes(discovery: dict, confirmation: dict) -> list[str]:
    """What a pair's block says beside its findings: the seeds without a batch gradient, the first-order error, and the
    shares near one half."""
    return [t for t in (idle_sentence(discovery, confirmation), error_sentence(discovery, confirmation)) if t] + half_sentences(
        discovery, confirmation
    )


def pair_block(title: str, discovery: dict, confirmation: dict) -> str:
    """One stored pair's markdown: its replicated findings (``findings_markdown``), then its ``pair_notes``."""
    notes = [f"  - {n}" for n in pair_notes(discovery, confirmation)]
    return "\n".join([findings_markdown([(titled(title, discovery, confirmation), discovery, confirmation)]), *notes])


def findings_block(folder: Path) -> str:
    """The replicated findings of every stored pair, with each pair's notes, as markdown."""
    return "\n".join(pair_block(*pair) for pair in load_stored(folder))


REAL_MODEL = "smollm2"
"""The stored pair of the real model (``STORED``'s documents REAL_MODEL-discovery.json and -confirmation.json) and its
log.param_drift runs across training (``across``: REAL_MODEL-drift.json, figure docs/figures/REAL_MODEL-drift.png)."""


def real_model_block(folder: Path, figure: str) -> str:
    """docs/trainer.md's paragraph on the probe of SmolLM2, generated from the stored documents: the events each
    seed set's batches held, the replicated findings, and log.param_drift across training with its figure."""
    from . import across  # deferred: it reads run logs through dfpo.trainer.compare (numpy)
    from .command import events_sentence  # deferred: torch

    title, disc, conf = stored_pair(folder, REAL_MODEL)
    drift = json.loads((folder / f"{REAL_MODEL}-drift.json").read_text(encoding="utf-8"))
    minutes = f"{disc['wall_s'] / 60:.0f} and {conf['wall_s'] / 60:.0f} min"
    return "\n".join(
        [
            f"Before any training step, the probe on the pretrained model ({minutes} for the two seed sets on this machine, "
            "beside other work):",
            "",
            f"- discovery set: {events_sentence(disc)} {pairs_sentence(disc)}",
            f"- confirmation set: {events_sentence(conf)} {pairs_sentence(conf)}",
            pair_block(title, disc, conf),
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


TEMPLATE = "smollm2-template"
"""The stored pair of the template task before training (``STORED``'s TEMPLATE-discovery.json and -confirmation.json):
the experiment of issue 58 item 8, gspo_noclip against its exact-cancellation arm where whole groups share tokens."""

TEMPLATE_MACHINE = "a 2-core Intel Xeon (23 GiB, one torch thread), beside a training stream"
"""Where the stored template probe ran (its documents do not record the machine): the session of 2026-12-06."""

TEMPLATE_PARTS = ("coef", "direct", "cross", "momentum", "measured")
"""The figures of a shared event the template paragraph prints per objective: |c|, the three parts of the first-order
prediction a step without weight decay has, and the measured change of log pi (``dfpo.core.probe.summary``); then the
direct part's share of the prediction, which is what cancelling the event's own coefficient can take away in one step."""


def parts_sentence(doc: dict, label: str) -> str:
    """An objective's shared events in one probe document: the mean over seeds of each ``TEMPLATE_PARTS`` figure (each
    a seed's mean absolute value over its probed events) and of the first-order error ratio."""
    means = []
    for figure in (*TEMPLATE_PARTS, "direct_share", "error_ratio"):
        per_seed = list(values(doc, label, "shared", figure).values())
        means.append(sum(per_seed) / len(per_seed) if per_seed else float("nan"))
    *parts, direct_share, error = means
    said = ", ".join(f"{name} {value:.3g}" for name, value in zip(TEMPLATE_PARTS, parts))
    return (
        f"`{label}`: {said}; the direct part is {100 * direct_share:.2g}% of the first-order prediction; "
        f"first-order error {100 * error:.1f}% of the measured change"
    )


def template_block(folder: Path) -> str:
    """docs/attribution.md's paragraph on the probe of the template task before training (issue 58 item 8), generated
    from its stored documents alone: the shared events each set's batches held and how many every completion of a
    group holds, and each objective's mean parts per set (the replicated findings are in ``findings_block``)."""
    from .report import events_sentence  # deferred: torch

    _, disc, conf = stored_pair(folder, TEMPLATE)
    minutes = f"{disc['wall_s'] / 60:.0f} and {conf['wall_s'] / 60:.0f} min"
    lines = [
        f"Before any training step, from the warmed-up model every stage-1 cell starts from ({minutes} for the two seed "
        f"sets on {TEMPLATE_MACHINE}; figures are means over seeds of each seed's mean absolute value over "
        "its probed events, in log pi):",
        "",
    ]
    for name, doc in (("discovery", disc), ("confirmation", conf)):
        parts = "; ".join(parts_sentence(doc, label) for label in doc["objectives"])
        lines.append(f"- {name} set (seeds {doc['seeds'][0]}-{doc['seeds'][-1]}): {events_sentence(doc)} {parts}.")
    return "\n".join(lines)
