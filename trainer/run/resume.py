"""What a resume may change and what it may not: the config a checkpoint was made with, compared key by key.

A resume continues a run exactly; ``RESUME_SETTABLE`` are the keys ``--set`` may change with ``--resume`` without
breaking that, and ``check_same_config`` names every other key that differs, with both values. ``resume_config`` is
the config of ``dfpo train --resume RUN_DIR`` (and ``dfpo probe --run RUN_DIR``) with those checks applied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Config, config_to_dict
from .layout import RunDir


def flat_items(table: dict, prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-4}}`` -> ``{"optim.lr": 1e-4}`` (nested tables as dotted keys)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and value:
            out.update(flat_items(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def same_setting(key: str, was: dict, now: dict, defaults: dict) -> bool:
    """Whether flat configs ``was`` (a run's, or a checkpoint's) and ``now`` agree on ``key``. A key only ``now`` has
    is a setting added to dfpo after ``was`` was written: it agrees only where ``now`` holds its default (``defaults``,
    flat), which keeps the behaviour the run had; any other key only one side has disagrees."""
    if key not in was and key in now and key in defaults:
        return now[key] == defaults[key]
    return was.get(key, _MISSING) == now.get(key, _MISSING)


def config_differences(a: dict, b: dict, *, ignore: tuple[str, ...] = (), defaults: dict | None = None) -> list[str]:
    """Dotted keys whose values differ between two config dicts (``config_to_dict``; ``a`` the older), except
    ``ignore`` and the keys under them; a key ``a`` lacks agrees where ``b`` holds its default (``same_setting``)."""
    fa, fb, fd = flat_items(a), flat_items(b), flat_items(defaults or {})
    skipped = lambda key: any(key == p or key.startswith(p + ".") for p in ignore)  # noqa: E731
    return sorted(k for k in set(fa) | set(fb) if not skipped(k) and not same_setting(k, fa, fb, fd))


_MISSING = object()

RESUME_SETTABLE = (
    "train.steps",
    "train.save_every",
    "train.save_final",
    "log.progress",
    "log.samples_every",
    "eval.every",
    "train.parallel",
)
"""Keys that --set may change when resuming without breaking exact continuation."""
RESUME_IGNORED = (*RESUME_SETTABLE, "run_dir")
"""Config keys a resume may change: those --set may change with --resume, and where the folder now is."""


def check_same_config(run_dir: str | Path, saved: dict | None, cfg: Config) -> None:
    """ValueError naming each key (and both values) in which ``cfg`` differs from the config the checkpoint was made
    with (``saved``), the resume-settable keys aside; nothing to check for a checkpoint of an older dfpo (None)."""
    if saved is None:
        return
    current = config_to_dict(cfg)
    diff = config_differences(saved, current, ignore=RESUME_IGNORED, defaults=config_to_dict(Config()))
    if diff:
        raise ValueError(config_mismatch_message(run_dir, diff, saved, current))


def config_mismatch_message(run_dir: str | Path, keys: list[str], saved: dict, current: dict) -> str:
    a, b = flat_items(saved), flat_items(current)
    shown = ", ".join(f"{k} ({a.get(k)!r} in the checkpoint, {b.get(k)!r} in config.toml)" for k in keys[:5])
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return (
        f"--resume {run_dir}: {RunDir(run_dir).config} differs from the config checkpoint.pt was made with: {shown}{more}. "
        "A resume continues that run exactly: put config.toml back as it was (dfpo train --resume RUN --restore-config "
        "writes it from the checkpoint), or start a new run with --config"
    )


def resume_config(run_dir: Path, sets: list[str], *, restore: bool = False) -> Config:
    """The config of ``--resume RUN_DIR``: RUN_DIR/config.toml with the --set changes a resume allows, checked
    against the config the checkpoint was made with (checkpoint.json) before any work. ``restore`` first writes
    config.toml back from the checkpoint's record. ValueError naming the file and the key for everything else."""
    import tomllib

    from ...core.files import check_input_file, write_run_file
    from ..config import apply_overrides, config_from_dict, config_text, dict_to_toml
    from . import signals
    from .checkpoint import read_meta

    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"--resume {run_dir} is a file, not a run folder")
    if not run_dir.is_dir():
        raise ValueError(f"--resume {run_dir}: no such folder")
    cfg_path, meta = RunDir(run_dir).config, read_meta(run_dir)
    saved = None if meta is None else meta.config
    hint = f" (dfpo train --resume {run_dir} --restore-config writes it back from the checkpoint)" if saved is not None else ""
    if restore:
        if saved is None:
            raise ValueError(f"--restore-config: {run_dir / 'checkpoint.json'} holds no config (no checkpoint, or one of an older dfpo)")
        with signals.held():  # a signal waits for the rename: no temporary file is left in the run folder
            write_run_file(cfg_path, dict_to_toml(saved))
    bad = [s for s in sets if s.split("=", 1)[0].strip() not in RESUME_SETTABLE]
    if bad:
        raise ValueError(
            f"--set {bad[0]!r} is not allowed with --resume (it would break exact continuation); allowed: {', '.join(RESUME_SETTABLE)}"
        )
    if not cfg_path.exists():
        raise ValueError(f"--resume {run_dir}: no config.toml in it; is it a dfpo run folder?{hint}")
    check_input_file("--resume", cfg_path)
    text = config_text(cfg_path)
    if not text.strip():
        raise ValueError(f"{cfg_path} is empty: a resume never falls back to built-in defaults{hint}")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{cfg_path} is not valid TOML ({err}){hint}") from None
    raw = apply_overrides(raw, sets)
    raw["run_dir"] = str(run_dir)
    try:
        cfg = config_from_dict(raw)
    except ValueError as err:
        raise ValueError(f"{cfg_path}: {err}") from None
    if meta is None and not RunDir(run_dir).checkpoint.exists():
        raise ValueError(no_checkpoint_message(run_dir, cfg))
    check_same_config(run_dir, saved, cfg)
    return cfg


def no_checkpoint_message(run_dir: Path, cfg: Config) -> str:
    """Why ``--resume RUN_DIR`` has nothing to continue from when the folder holds no checkpoint, and what to do."""
    if cfg.train.save_every == 0:
        finished = RunDir(run_dir).summary.is_file()
        why = (
            "it finished without one (train.save_every = 0, train.save_final = false), so it cannot be extended; start a new run in another folder"
            if finished
            else "the run writes none during training (train.save_every = 0), so it cannot be continued; start it again with "
            "dfpo train and its config (the same folder starts from step 0)"
        )
    else:
        why = "the run stopped before its first checkpoint; start it again"
    return f"--resume {run_dir}: no {RunDir.CHECKPOINT} in it: {why}"


def finished_run_message(run_dir: Path, steps: int) -> str | None:
    """The one line ``dfpo train --resume RUN_DIR`` says, before any work, when the run already finished its ``steps``
    steps (its summary.json says so); None when it has steps to go, or no readable summary.

    Such a resume trains nothing and writes nothing (summary.json, the logs, the checkpoint stay as they were), and the
    command exits 0: a job script that resumes whatever it finds (after a requeue, a reboot) must not fail, nor redo
    anything, once its run is done, and a transformers/TRL ``Trainer`` resumed at its last step trains no step and
    raises no error either. To train further, raise train.steps (a resume may: ``RESUME_SETTABLE``)."""
    import json

    summary_path = RunDir(run_dir).summary
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("steps") != steps or isinstance(summary.get("steps"), bool):
        return None
    return (
        f"--resume {run_dir}: the run already finished its {steps} steps, so nothing was trained and {summary_path} is as it "
        f"was; to train it further: dfpo train --resume {run_dir} --set train.steps=N (N > {steps})"
    )
