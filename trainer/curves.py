"""RUN_DIR/curves.png: the training curves of an LLM run, as the toy lab draws its own.

``dfpo train`` writes it at the end of every run (so ``dfpo compare``'s runs have one too), and
``dfpo train --curves RUN_DIR`` draws it again from the logs of any run folder, finished or not. One panel per
metric of ``PANELS`` that the run logged: the train reward (with eval avg@k from eval.jsonl), the policy loss,
the rollout entropy, the clipped fraction, the gradient norm, Asym (eq 23), the completion length and the KL to
the reference. Each panel shows the logged values and their rolling mean over ``SMOOTH`` steps.

The logs are read tolerantly: a line that is not a JSON object (the torn last line of a killed run) is skipped,
so is a value that is not a finite number, and of several lines for one step (a resumed run) the last counts.
Nothing read from the folder is drawn as markup: matplotlib's mathtext (``$...$``) and TeX are off for the
figure, so a run folder or objective named ``$\\frac{a}{b}$`` is drawn as written.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from ..core.files import write_atomic
from .run.layout import RunDir
from .run.logs import JsonlLog

PANELS = (
    ("reward/mean", "train reward (mean over the rollout batch)"),
    ("loss/policy", "policy loss"),
    ("entropy/rollout", "entropy of the sampled tokens (nats)"),
    ("clip/frac_high", "clipped fraction, high side"),
    ("grad/norm", "gradient norm (before clipping)"),
    ("weights/asym", "Asym (eq 23)"),
    ("completion/length", "completion length (tokens)"),
    ("kl/ref", "KL to the reference model"),
)
"""(metric key, panel title) in the order they are drawn; a metric the run did not log has no panel."""
SMOOTH = 10
"""Window of the rolling mean drawn over each metric, in steps."""


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` in log ``records``: finite numbers only, the last record of a step counts, by step."""
    by_step: dict[int, float] = {}
    for rec in records:
        step, value = rec.get("step"), rec.get(key)
        if isinstance(step, int) and not isinstance(step, bool) and isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                by_step[step] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def rolling_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def _objective(run_dir: Path) -> str:
    """The run's objective from its config.toml ('' when it cannot be read)."""
    try:
        name = tomllib.loads(RunDir(run_dir).config.read_text(encoding="utf-8")).get("objective", {}).get("name", "")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return ""
    return name if isinstance(name, str) else ""


def write_curves(run_dir: Path) -> Path:
    """Draw RUN_DIR/curves.png from its metrics.jsonl and eval.jsonl (see the module docstring); returns its path.
    ValueError when the folder holds no logged step; the file is written atomically (a temporary file renamed)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"--curves {run_dir}: no such folder")
    metrics = JsonlLog.read(RunDir(run_dir).metrics)
    panels = [(key, title, *series(metrics, key)) for key, title in PANELS]
    panels = [p for p in panels if p[2]]
    if not panels:
        raise ValueError(f"{run_dir}: no training step in metrics.jsonl yet (is it a dfpo train run folder?)")
    evals = JsonlLog.read(RunDir(run_dir).evals)
    eval_key = next((k for rec in evals for k in sorted(rec) if k.startswith("eval/avg@")), None)

    import matplotlib  # deferred: only this writer needs it, and it must get the Agg backend first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(4, len(panels))
    rows = math.ceil(len(panels) / columns)
    with plt.rc_context({"text.usetex": False, "text.parse_math": False}):  # text from the folder is never markup
        fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), dpi=100, squeeze=False)
        for ax, (key, title, steps, values) in zip(axes.flat, panels):
            ax.plot(steps, values, lw=0.8, alpha=0.4, color="tab:blue", label="per step")
            ax.plot(steps, rolling_mean(values, SMOOTH), lw=1.8, color="tab:blue", label=f"mean of {SMOOTH} steps")
            if key == "reward/mean" and eval_key is not None:
                ax.plot(
                    *series(evals, eval_key), "o-", color="tab:orange", lw=1.4, ms=4, label=f"held-out {eval_key.removeprefix('eval/')}"
                )
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
        axes.flat[0].legend(fontsize=7)
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
        objective = _objective(run_dir)
        fig.suptitle(f"{run_dir.name}" + (f" ({objective})" if objective else ""), fontsize=11)
        fig.tight_layout()
        path = RunDir(run_dir).curves
        try:
            write_atomic(path, lambda fh: fig.savefig(fh, format="png"))
        finally:
            plt.close(fig)
    return path
