"""Cross-check against verl's own code (issue 30, item 4): ReMax, the optimal token baseline, OPO and REINFORCE++ with a
group baseline computed by verl.trainer.ppo.core_algos in verl's environment (scripts/verl_advantages.py, JSON in and
out) equal dfpo's on ragged lengths. Skipped without a verl environment (scripts/verl_env.sh, or DFPO_VERL_PYTHON)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from dfpo import group_advantages
from dfpo.core.loss.advantages import optimal_token_baseline

ROOT = Path(__file__).resolve().parents[2]


def _verl_python() -> str | None:
    candidate = os.environ.get("DFPO_VERL_PYTHON") or str(ROOT / ".venv-verl" / "bin" / "python")
    return str(Path(candidate).absolute()) if Path(candidate).exists() else None


def _cases(seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    B, G = 12, 4
    lengths = torch.randint(1, 10, (B,), generator=gen).tolist()
    T = max(lengths)
    base = {
        "rewards": torch.tensor([0.0, 0.5, 1.0])[torch.randint(0, 3, (B,), generator=gen)].tolist(),
        "lengths": lengths,
        "index": [i // G for i in range(B)],
    }
    greedy = torch.rand(B // G, generator=gen, dtype=torch.float64).repeat_interleave(G).tolist()
    stats = {
        "old_logp": (-3 * torch.rand(B, T, generator=gen, dtype=torch.float64)).tolist(),
        "pi_squared": torch.rand(B, T, generator=gen, dtype=torch.float64).tolist(),
    }
    isw = (0.5 + torch.rand(B, T, generator=gen, dtype=torch.float64)).tolist()
    cases = [{**base, "estimator": "remax", "greedy": greedy}, {**base, "estimator": "opo"}]
    cases.append({**base, "estimator": "reinforce_plus_plus_baseline"})
    for weights in (None, isw):
        for zero_tail in (False, True):
            cases.append({**base, **stats, "estimator": "optimal_token_baseline", "is_weights": weights, "handle_zero_tail": zero_tail})
    return cases


def _dfpo(case: dict) -> torch.Tensor:
    """dfpo's advantages of a case, laid over its tokens (B, T)."""
    lengths = torch.tensor(case["lengths"])
    mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]  # (B, T)
    rewards, ids = torch.tensor(case["rewards"], dtype=torch.float64), torch.tensor(case["index"])
    name = case["estimator"]
    if name == "optimal_token_baseline":
        isw = case["is_weights"]
        return optimal_token_baseline(
            rewards, ids, mask, torch.tensor(case["old_logp"], dtype=torch.float64), torch.tensor(case["pi_squared"], dtype=torch.float64),
            is_weights=None if isw is None else torch.tensor(isw, dtype=torch.float64), handle_zero_tail=case["handle_zero_tail"],
        )  # fmt: skip
    scale = {"remax": "remax", "opo": "opo", "reinforce_plus_plus_baseline": "reinforce_pp_baseline"}[name]
    extra = {"baselines": torch.tensor(case["greedy"], dtype=torch.float64)} if name == "remax" else {"lengths": lengths}
    return group_advantages(rewards, ids, scale=scale, **extra)[:, None] * mask  # (B, T)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dfpo_equals_verls_own_estimators(seed):
    python = _verl_python()
    if python is None:
        pytest.skip("no verl environment: build it with scripts/verl_env.sh (or set DFPO_VERL_PYTHON)")
    cases = _cases(seed)
    out = subprocess.run(
        [python, str(ROOT / "scripts" / "verl_advantages.py")],
        input=json.dumps({"cases": cases}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    verl = json.loads(out.stdout)["advantages"]
    for case, theirs in zip(cases, verl, strict=True):
        torch.testing.assert_close(_dfpo(case), torch.tensor(theirs, dtype=torch.float64), rtol=1e-9, atol=1e-9, msg=case["estimator"])
