"""dfpo's losses through verl's own registry, and verl's losses against dfpo's, on real tensors.

    .venv-verl/bin/python scripts/verl_check.py      # the verl environment: python3 -m venv .venv-verl &&
                                                     # .venv-verl/bin/pip install -c constraints.txt verl && pip install --no-deps -e .

1. ``import verl`` alone puts every dfpo preset in verl's POLICY_LOSS_REGISTRY (verl loads dfpo's plugin entry
   point); ``get_policy_loss_fn`` finds them, and on a batch laid out as verl lays it out (rollout.n consecutive
   rows a prompt, the group size read from the actor config's rollout_n) each returns ``dfpo.policy_loss`` with
   those groups. A Ray worker process finds them too.
2. verl's own geo_mean, gpg, sapo, kl_cov, vanilla (dual-clip), gspo, dppo_tv and dppo_kl against dfpo's gmpo,
   gpg, sapo, kl_cov, dapo with dual_clip_c, gspo, dppo_tv and dppo_kl on the same tensors (loss and gradient).
   Prints the largest differences; exits 1 when one exceeds 1e-6. Not compared: clip_cov (verl picks its tokens
   at random) and cispo (verl clamps the ratio on both sides, 1 - low and 1 + high; dfpo follows MiniMax-M1 and
   TRL: only the cap eps_high).
3. examples/verl_dfpo_grpo.sh: its overrides composed with verl's own ppo_trainer config (every key exists, the
   loss_mode is registered) pass ``check_groups_stay_whole``.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import torch

from dfpo import policy_loss
from dfpo.core.loss import OBJECTIVES, objective_from_label
from dfpo.integrations.verl import check_groups_stay_whole, loss_mode_name, verl_presets


def batch(seed: int = 0, n_groups: int = 3, G: int = 4, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    B = n_groups * G
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    logp = -0.1 - 2 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old = (logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)  # log-probs: below 0
    rewards = torch.rand(B, generator=g, dtype=torch.float64).view(n_groups, G)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).flatten()
    return logp, old, adv[:, None].expand(B, T) * mask, mask, G


def grad_of(fn, logp):
    x = logp.clone().requires_grad_()
    value = fn(x)
    (grad,) = torch.autograd.grad(value, x)
    return float(value), grad


def main() -> int:
    import warnings

    warnings.simplefilter("ignore")  # the adapter's once-per-loss note on verl's loss_agg_mode
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    logp, old, adv_bt, mask, G = batch()
    B = logp.shape[0]
    seq_adv = adv_bt.sum(-1) / mask.sum(-1)
    groups = torch.arange(B) // G
    worst = 0.0
    presets = verl_presets()  # all but the objectives that read a reference policy (verl's policy loss gets none)
    names = [name for name in POLICY_LOSS_REGISTRY if name in {loss_mode_name(p) for p in presets}]  # the plugin's, from import verl
    if len(names) != len(presets):
        print(f"verl's plugin entry point registered {len(names)} of {len(presets)} dfpo losses; is dfpo installed in this environment?")
        print("verl check: FAILED")
        return 1
    cfg = ActorConfig(
        strategy="fsdp", clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4, tau_pos=1.0, tau_neg=1.05,
        ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4, rollout_n=G,
        policy_loss=PolicyLossConfig(kl_cov_ratio=0.2, ppo_kl_coef=1.0),
    )  # fmt: skip
    for preset in presets:
        if OBJECTIVES[preset].token_mask in ("stapo", "top_entropy") or OBJECTIVES[preset].beta > 0 or OBJECTIVES[preset].entropy_coef > 0:
            continue  # these read entropy / a reference model, which verl's policy-loss signature does not carry
        fn = get_policy_loss_fn(loss_mode_name(preset))
        got, g_got = grad_of(lambda x, fn=fn: fn(old, x, adv_bt, mask, "token-mean", cfg)[0], logp)
        ref, g_ref = grad_of(
            lambda x, p=preset: policy_loss(p, logp=x, old_logp=old, advantages=seq_adv, mask=mask.bool(), group_ids=groups)[0], logp
        )
        diff = max(abs(got - ref), float((g_got - g_ref).abs().max()))
        worst = max(worst, diff)
    print(f"{len(names)} dfpo losses registered by `import verl`; through get_policy_loss_fn vs dfpo.policy_loss: max |diff| {worst:.1e}")
    peers = {
        # verl loss, its loss_agg_mode, dfpo label
        "geo_mean": ("token-mean", "gmpo"),
        "gpg": ("token-mean", "gpg"),
        "sapo": ("seq-mean-token-mean", "sapo"),
        "kl_cov": ("token-mean", "kl_cov:cov_ratio=0.2"),
        "vanilla": ("token-mean", "dapo:eps_low=0.4:eps_high=0.4:dual_clip_c=3"),  # verl's PPO loss with its dual-clip c = 3
        "gspo": ("seq-mean-token-mean", "gspo:eps_low=0.4:eps_high=0.4"),
        "dppo_tv": ("token-mean", "dppo_tv:eps_low=0.4:eps_high=0.4:dual_clip_c=3"),
        "dppo_kl": ("token-mean", "dppo_kl:eps_low=0.4:eps_high=0.4:dual_clip_c=3"),
    }
    ok = worst <= 1e-6
    for verl_name, (mode, label) in peers.items():
        fn = get_policy_loss_fn(verl_name)
        got, g_got = grad_of(lambda x, fn=fn, mode=mode: fn(old, x, adv_bt, mask, mode, cfg)[0], logp)
        spec = objective_from_label(label)
        ref, g_ref = grad_of(
            lambda x, spec=spec: policy_loss(spec, logp=x, old_logp=old, advantages=seq_adv, mask=mask.bool(), group_ids=groups)[0], logp
        )
        diff = max(abs(got - ref), float((g_got - g_ref).abs().max()))
        print(f"verl {verl_name:9s} vs dfpo {label:22s}: loss {got:+.6f} vs {ref:+.6f}, max |diff| (loss, grad) {diff:.1e}")
        ok &= diff <= 1e-6 or math.isnan(diff)
    ok &= ray_worker_finds_the_losses(len(presets))
    ok &= example_config_keeps_groups_whole()
    print("verl check:", "ok" if ok else "FAILED")
    return 0 if ok else 1


def _dfpo_losses_in_this_process() -> int:
    import verl  # noqa: F401  (verl loads its plugins on import)
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    return sum(name.startswith("dfpo") for name in POLICY_LOSS_REGISTRY)


def ray_worker_finds_the_losses(expected: int) -> bool:
    """A Ray worker (a fresh process, as verl's actors are) finds every dfpo loss in verl's registry."""
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        found = ray.get(ray.remote(_dfpo_losses_in_this_process).remote(), timeout=300)
    finally:
        ray.shutdown()
    print(f"a Ray worker process finds {found} dfpo losses in verl's registry (expected {expected})")
    return found == expected


def example_overrides(path: Path) -> list[str]:
    """The key=value lines of the example's `python3 -m verl.trainer.main_ppo` command, its shell variables
    given their defaults (paths need not exist to compose the config)."""
    defaults = {"$DATA": "/data/gsm8k", "$MODEL": "Qwen/Qwen3-0.6B", "$LOSS": "dfpo_min"}
    out = []
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"\s+([a-z_.]+=\S+)(?: \\| \"\$@\")?", line)
        if m:
            item = m.group(1)
            for var, value in defaults.items():
                item = item.replace(var, value)
            out.append(item)
    return out


def example_config_keeps_groups_whole() -> bool:
    """examples/verl_dfpo_grpo.sh composed with verl's own ppo_trainer config: every key exists, the loss_mode is
    one of dfpo's registered losses, and no setting splits a group."""
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    overrides = example_overrides(Path(__file__).resolve().parents[1] / "examples" / "verl_dfpo_grpo.sh")
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    actor = OmegaConf.to_container(cfg.actor_rollout_ref.actor, resolve=True)
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    n = int(cfg.actor_rollout_ref.rollout.n)
    check_groups_stay_whole(actor, n, trainer)
    mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    ok = mode in POLICY_LOSS_REGISTRY and actor.get("rollout_n") == n and len(overrides) >= 30
    print(
        f"examples/verl_dfpo_grpo.sh: {len(overrides)} overrides compose with verl's ppo_trainer config; loss_mode={mode!r} "
        f"registered: {mode in POLICY_LOSS_REGISTRY}; actor.rollout_n={actor.get('rollout_n')} = rollout.n={n}; groups stay whole"
    )
    return ok


if __name__ == "__main__":
    sys.exit(main())
