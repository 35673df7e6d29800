"""The claims ledger: run every check, render the verdicts as a table, JSON or markdown.

    from .ledger import run_ledger, render_markdown
    claims = run_ledger()                 # list[Claim], paper order
    claims = run_ledger(["eq-55"])        # a subset

``REGISTRY`` maps each claim id to the function that checks it; ids are stable (tests pin
each one's verdict). ``count_line()`` is the README's one-line summary.
Regenerate docs/ledger.md with ``dfpo theory --markdown docs/ledger.md``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from . import (
    appendix_a,
    bias,
    cancellation,
    clipping,
    corrections,
    drift,
    estimators,
    gradients,
    param_drift,
    peer_terms,
    peers,
    stapo,
    transforms,
    trust_terms,
)
from .claim import FAILS, HOLDS, HOLDS_UNDER_CONDITIONS, VERDICTS, Claim

PAPER = "arXiv 2604.13088 (Design Conditions for Intra-Group Learning of Sequence-Level Rewards: Token Gradient Cancellation)"
REPRODUCE = "dfpo theory --markdown docs/ledger.md"

# Paper order: the 26 claims the paper states as propositions, corollaries and key equations, plus further
# claims found while checking them (eq-18, eq-23, eq-66-67, eq-75-76, eq-81, sec-K.4, tab-3-no-stopgrad,
# stopgrad-forms, tab-3-scale, stapo-cancel), eq 5 in parameter space (cor-3.2-params), and two for the peers'
# losses and estimators (soft-gate-cancel, advantage-zero-sum), and the peers' added terms (proximal-penalty-cancel,
# positive-nll-cancel).
REGISTRY: Mapping[str, Callable[[], Claim]] = {
    "prop-3.1": drift.check_prop_3_1,
    "cor-3.2": drift.check_cor_3_2,
    "cor-3.2-params": param_drift.check_cor_3_2_params,
    "cor-3.3": cancellation.check_cor_3_3,
    "cor-3.4": drift.check_cor_3_4,
    "eq-9": cancellation.check_eq_9,
    "eq-10": cancellation.check_eq_10,
    "eq-13": cancellation.check_eq_13,
    "eq-66-67": gradients.check_eq_66_67,
    "sec-4.4.1": cancellation.check_sec_4_4_1,
    "eq-18": transforms.check_eq_18,
    "eq-23": transforms.check_eq_23,
    "tab-3-no-stopgrad": transforms.check_tab_3_no_stopgrad,
    "stopgrad-forms": transforms.check_stopgrad_forms,
    "tab-3-scale": transforms.check_tab_3_scale,
    "eq-30": appendix_a.check_eq_30,
    "eq-38": appendix_a.check_eq_38,
    "eq-41": appendix_a.check_eq_41,
    "eq-49": clipping.check_eq_49,
    "eq-51": transforms.check_eq_51,
    "eq-55": transforms.check_eq_55,
    "thm-C.1": transforms.check_thm_c_1,
    "eq-74": drift.check_eq_74,
    "cor-F.1": clipping.check_cor_f_1,
    "eq-75-76": clipping.check_eq_75_76,
    "cor-G.1": drift.check_cor_g_1,
    "eq-81": clipping.check_eq_81,
    "cor-H.1": cancellation.check_cor_h_1,
    "sec-H.3": clipping.check_sec_h_3,
    "eq-92": bias.check_eq_92,
    "eq-93": bias.check_eq_93,
    "sec-K.4": bias.check_sec_k_4,
    "eq-96": bias.check_eq_96,
    "thm-K.1": transforms.check_thm_k_1,
    "stapo-grad-norm": stapo.check_stapo_grad_norm,
    "stapo-bounds": stapo.check_stapo_bounds,
    "stapo-cancel": stapo.check_stapo_cancel,
    "soft-gate-cancel": peers.check_soft_gate_cancel,
    "advantage-zero-sum": peers.check_advantage_zero_sum,
    "rollout-correction-cancel": corrections.check_rollout_correction_cancel,
    "peer-estimators-zero-sum": estimators.check_peer_estimators_zero_sum,
    "proximal-penalty-cancel": peer_terms.check_proximal_penalty_cancel,
    "positive-nll-cancel": peer_terms.check_positive_nll_cancel,
    "peer-trust-terms-cancel": trust_terms.check_peer_trust_terms_cancel,
}


def validate_ids(ids: Iterable[str] | None) -> list[str]:
    """The ids to run, in paper order; ValueError naming the first unknown id."""
    if ids is None:
        return list(REGISTRY)
    wanted = list(ids)
    for claim_id in wanted:
        if claim_id not in REGISTRY:
            raise ValueError(f"unknown claim id --only {claim_id!r}; known: {', '.join(REGISTRY)}")
    return [claim_id for claim_id in REGISTRY if claim_id in set(wanted)]


def run_ledger(ids: Iterable[str] | None = None, *, timings: dict[str, float] | None = None) -> list[Claim]:
    """Run the checks (all, or ``ids``) and return their claims in paper order.

    ``timings``, when given, receives the wall time of each check in seconds.
    """
    claims = []
    for claim_id in validate_ids(ids):
        start = time.perf_counter()
        claim = REGISTRY[claim_id]()
        if timings is not None:
            timings[claim_id] = time.perf_counter() - start
        if claim.id != claim_id:
            raise RuntimeError(f"check registered as {claim_id!r} returned a claim with id {claim.id!r}")
        claims.append(claim)
    return claims


def summary_counts(claims: Sequence[Claim]) -> dict[str, int]:
    counts = Counter(c.verdict for c in claims)
    return {v: counts.get(v, 0) for v in VERDICTS}


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render_table(claims: Sequence[Claim], *, verbose: bool = False) -> str:
    """Plain-text table: id, verdict, method, source (and, verbose, statement and evidence)."""
    rows = [("ID", "VERDICT", "METHOD", "SOURCE")] + [(c.id, c.verdict, c.method, _short(c.source, 60)) for c in claims]
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if verbose:
        for c in claims:
            lines += [
                "",
                f"[{c.id}] {c.verdict}",
                f"  claim:      {c.statement}",
                f"  conditions: {c.conditions}",
                f"  evidence:   {c.evidence}",
            ]
            if c.met_by:
                lines.append(f"  met by:     {c.met_by}")
            if c.notes:
                lines.append(f"  notes:      {c.notes}")
    return "\n".join([*lines, "", count_line(claims)[:-1]])


def render_json(claims: Sequence[Claim]) -> str:
    """JSON document: paper, summary counts and every claim's fields (the app reads this)."""
    doc = {
        "paper": PAPER,
        "reproduce": REPRODUCE.replace("--markdown docs/ledger.md", "--json PATH"),
        "summary": summary_counts(claims),
        "claims": [c.to_dict() for c in claims],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_BADGE = {HOLDS: "holds", HOLDS_UNDER_CONDITIONS: "**holds-under-conditions**", FAILS: "**fails**"}


def count_line(claims: Sequence[Claim]) -> str:
    """One sentence: how many claims and how many of each verdict ("38 claims: 22 holds, ...")."""
    counts = summary_counts(claims)
    return f"{len(claims)} claims: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "."


def summary_table_markdown(claims: Sequence[Claim]) -> str:
    """Markdown table: one row per claim (id, verdict, source, statement)."""
    lines = ["| id | verdict | source | claim (our words) |", "|---|---|---|---|"]
    for c in claims:
        lines.append(f"| `{c.id}` | {_BADGE[c.verdict]} | {_md_cell(c.source)} | {_md_cell(c.statement)} |")
    return "\n".join([*lines, "", count_line(claims)])


def render_markdown(claims: Sequence[Claim]) -> str:
    """The full ledger document (docs/ledger.md): summary table, then every claim's record."""
    out = [
        "# Claims ledger",
        "",
        f"Every claim of {PAPER}, checked symbolically (sympy, exact rationals) and numerically on real "
        "softmax tables with autograd through this project's loss core (`dfpo.policy_loss`).",
        "",
        "- **holds**: checked under the paper's conditions, including those it states itself (e.g. 'consider the "
        "linear segment'), and under every attempt to break it within them (groups larger than two, unequal lengths, "
        "clipping active on either side, both advantage signs, product ratio eq 11 and geometric-mean ratio eq 44, "
        "softmax tables); nothing broke. What happens outside a stated condition is in the record's notes.",
        "- **holds-under-conditions**: true only under a condition the paper does not state (named in the record), one "
        "that some instance of the paper's own setting (softmax policies, tabular or LLM, with group-relative advantages) "
        "meets: the record names it.",
        "- **fails**: false as stated; the record gives an exact counterexample. A claim that holds only under a condition "
        "no softmax policy can meet fails too (the record's notes name the condition).",
        "",
        f"Generated by `{REPRODUCE}` (do not edit by hand). `dfpo theory --only ID ...` re-runs single claims; "
        "`pytest tests/theory` pins every verdict.",
        "",
        "## Summary",
        "",
        summary_table_markdown(claims),
        "",
        "## Records",
    ]
    for c in claims:
        out += [
            "",
            f"### `{c.id}` — {c.verdict}",
            "",
            f"- **Source:** {c.source}",
            f"- **Claim:** {c.statement}",
            f"- **Conditions checked:** {c.conditions}",
            f"- **Method:** {c.method}",
            f"- **Evidence:** {c.evidence}",
        ]
        if c.met_by:
            out.append(f"- **Condition met in the paper's setting by:** {c.met_by}")
        if c.notes:
            out.append(f"- **Notes:** {c.notes}")
    return "\n".join(out) + "\n"
