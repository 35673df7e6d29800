"""verl's own advantage estimators on cases read from stdin, for dfpo's cross-check (run with verl's environment's python).

    DFPO_VERL_PYTHON scripts/verl_advantages.py < cases.json > advantages.json

Reads JSON {"cases": [...]}, each case {"estimator": "remax" | "optimal_token_baseline" | "opo" | ..., "rewards": [B],
"lengths": [B], "index": [B], and for remax "greedy": [B], for OTB "old_logp", "pi_squared", optionally "is_weights"
(each [B][T]) and "handle_zero_tail"}; lays each outcome reward at its completion's last real token as verl's
token_level_rewards, calls verl.trainer.ppo.core_algos' function of that estimator and prints {"advantages": [[B][T], ...]}
as JSON. Imports verl, torch and numpy only: data in and out is JSON, never pickled. tests/core/test_verl_advantages.py
compares the result with dfpo's group_advantages and optimal_token_baseline.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from verl.trainer.ppo import core_algos


def verl_advantages(case: dict) -> list[list[float]]:
    """One case through verl's estimator: (B, T) advantages as nested lists."""
    lengths = case["lengths"]
    B, T = len(lengths), max(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(torch.float64)  # (B, T)
    scores = torch.zeros(B, T, dtype=torch.float64)
    scores[torch.arange(B), torch.tensor(lengths) - 1] = torch.tensor(case["rewards"], dtype=torch.float64)  # (B, T)
    index = np.array(case["index"])
    name = case["estimator"]
    if name == "remax":
        adv, _ = core_algos.compute_remax_outcome_advantage(scores, torch.tensor(case["greedy"], dtype=torch.float64), mask)
    elif name == "optimal_token_baseline":
        isw = case.get("is_weights")
        adv, _ = core_algos.compute_optimal_token_baseline_advantage(
            scores, mask, index, torch.tensor(case["old_logp"], dtype=torch.float64), torch.tensor(case["pi_squared"], dtype=torch.float64),
            rollout_is_weights=None if isw is None else torch.tensor(isw, dtype=torch.float64),
            handle_zero_tail=case["handle_zero_tail"],
        )  # fmt: skip
    elif name == "opo":
        adv, _ = core_algos.compute_opo_outcome_advantage(scores, mask, index)
    elif name == "reinforce_plus_plus_baseline":
        adv, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(scores, mask, index)
    else:
        raise SystemExit(f"verl_advantages.py: unknown estimator {name!r}")
    return adv.tolist()


def main() -> None:
    cases = json.load(sys.stdin)["cases"]
    json.dump({"verl": __import__("verl").__version__, "advantages": [verl_advantages(c) for c in cases]}, sys.stdout)


if __name__ == "__main__":
    main()
