"""Every seed of a ``dfpo probe`` plan, in order: each probed (``one_seed``) and stored under OUT/seeds/ as soon as it
ends, or read back from there when an earlier run of the same probe stored it; gathered into the document
probe.json holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from ...core.files import write_run_file
from ...core.settings import finite_number
from ..config import config_to_dict
from .one_seed import probe_seed
from .plan import ProbePlan

SEEDS_FOLDER = "seeds"
"""OUT/seeds/seedN.json: one seed's records, written as soon as that seed is probed, so that a probe stopped part-way
(a session's end kills it) goes on at the next seed when the same command runs again."""


def seed_key(plan: ProbePlan) -> dict:
    """Everything that decides one seed's records besides the seed (as JSON reads it back): the labels, the steps
    before the probed one, the event cap, the config, the run folder, the shared-event rule and the code
    (``dfpo.trainer.run.code.source_sha256``)."""
    from ..run.code import source_sha256

    key = {
        "objectives": list(plan.labels),
        "move_steps": plan.move_steps,
        "max_events": plan.max_events,
        "config": {k: v for k, v in config_to_dict(plan.config).items() if k != "seed"},
        "run": None if plan.run is None else str(plan.run),
        "shared_events": SHARED_RULE,
        "source_sha256": source_sha256(),
    }
    return json.loads(json.dumps(key))


def seed_file(plan: ProbePlan, seed: int) -> Path:
    return plan.out / SEEDS_FOLDER / f"seed{seed}.json"


def stored_seeds(plan: ProbePlan, key: dict) -> dict[int, dict]:
    """The seeds of ``plan`` already probed under OUT/seeds/ ({seed: its stored document}); ValueError naming the file
    when one cannot be read or was probed with other settings or code than ``key`` (``seed_key``; nothing is probed
    then)."""
    found = {}
    for seed in plan.seeds:
        path = seed_file(plan, seed)
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} cannot be read as JSON ({err}): move it away to probe seed {seed} again") from None
        if not (
            isinstance(doc, dict) and doc.get("seed") == seed and isinstance(doc.get("records"), list) and finite_number(doc.get("wall_s"))
        ):
            raise ValueError(f"{path} is not a stored seed of dfpo probe: move it away to probe seed {seed} again")
        if doc.get("key") != key:
            differ = sorted(k for k in key if (doc.get("key") or {}).get(k) != key[k])
            raise ValueError(
                f"{path} was probed with other settings or code ({', '.join(differ) or 'its key'} differ): run the command "
                "that made it, move the folder away, or choose another --out"
            )
        found[seed] = doc
    return found


def run_probe(plan: ProbePlan, say: Callable[[str], None] = lambda msg: None) -> dict:
    """Every seed of ``plan``; the document probe.json holds (settings and per-seed records). A seed stored under
    OUT/seeds/ by an earlier run of the same probe is read, not probed again; ``wall_s`` sums each seed's seconds."""
    key = seed_key(plan)
    stored, records, wall_s = stored_seeds(plan, key), [], 0.0
    for k, seed in enumerate(plan.seeds):
        if seed in stored:
            say(f"dfpo probe: seed {seed} ({k + 1}/{len(plan.seeds)}): probed before, read from {seed_file(plan, seed)}")
            seed_records, seconds = stored[seed]["records"], float(stored[seed]["wall_s"])
        else:
            say(f"dfpo probe: seed {seed} ({k + 1}/{len(plan.seeds)})")
            t0 = time.time()
            seed_records = probe_seed(plan, seed, say)
            seconds = time.time() - t0
            doc = {"seed": seed, "key": key, "records": seed_records, "wall_s": seconds}
            seed_file(plan, seed).parent.mkdir(parents=True, exist_ok=True)
            write_run_file(seed_file(plan, seed), json.dumps(doc, indent=1, sort_keys=True) + "\n")
        records += seed_records
        wall_s += seconds
    cfg = plan.config
    return {
        "command": plan.command,
        "objectives": list(plan.labels),
        "controls": plan.controls,
        "seeds": list(plan.seeds),
        "run": None if plan.run is None else str(plan.run),
        "move_steps": plan.move_steps,
        "max_events": plan.max_events,
        "shared_events": SHARED_RULE,
        "settings": {
            "model": cfg.model.name,
            "task": cfg.data.task,
            "prompts_per_step": cfg.rollout.prompts_per_step,
            "group_size": cfg.rollout.group_size,
            "lr": cfg.optim.lr,
            "max_grad_norm": cfg.optim.max_grad_norm,
            "old_logp": cfg.rollout.old_logp,
        },
        "records": records,
        "wall_s": wall_s,
    }


SHARED_RULE = "subset"
"""probe.json's ``shared_events``: the rule that picked the shared events (``dfpo.core.probe.EVENT_RULES``); a
document without it used ``dfpo.core.probe.OLD_RULE``."""
