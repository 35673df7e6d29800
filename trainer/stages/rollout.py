"""The rollout stage: prompts -> G completions each, decoded and scored, laid out as one rollout batch.

Each step takes ``prompts_per_step`` prompts from the seeded, resumable ``PromptSampler`` and samples G
completions of each (a group, GRPO's sampling of eq 14 from pi_old), scores them with the reward (timeouts and
errors give 0 and are counted) and lays them out with ``build_batch``. Choices:

1. On several processes each samples and scores its share of the groups (every world-th) and the shares are
   gathered (``parallel``), so every process holds the whole batch. With per-group seeds (``seed_per_group``)
   group g of rollout draw d samples from seed (seed, step, d * n + g): the completions do not depend on how the
   groups are shared out.
2. DAPO's dynamic sampling (``rollout.dynamic_sampling``, arXiv 2503.14476 sec. 3.2): groups whose rewards are
   all equal carry no group-relative signal and are dropped; more prompts are drawn until ``prompts_per_step``
   groups remain or ``rollout.max_extra_batches`` extra draws were made (then the step trains on the groups it
   has; with none at all, on the last draw as it is).
3. Evaluation (``evaluate``) samples k completions of every eval prompt with its own forked RNG, so that it
   changes nothing the training draws, and measures the learning tax (``tax.TaxMeter``: against pi_init, scored at
   the step-0 evaluation and kept in the run folder): at the template's positions of a task with an answer template
   (``eval/template_kl``) and, as a proxy, at the eval prompts' own positions (``eval/tax_kl``). It needs the policy
   itself: ``policy_model``, which the trainer always passes (a vLLM engine holds no ``.model``), else the HF
   engine's model; without either neither is logged. For a task with a template the share of the samples that
   restate it is ``eval/template``.
4. With eval.greedy, the evaluations at step 0 and at the end (step train.steps) also decode one greedy completion
   of every eval prompt (``greedy_eval``): ``eval/greedy_acc``, and ``eval/greedy_template`` for a template task.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ..parallel import OneProcess
from ..prompts import encode_prompts
from ..rewards.compute import RewardBatch
from ..sampler import (
    RolloutBatch,
    Samples,
    SamplingParams,
    build_batch,
    greedy_params,
    log_kept_mass,
    row_seed,
    sampler_logp,
    truncates,
)
from ..tasks import TEMPLATE_TASKS, PromptSampler, answer_template, template_answer, template_share
from .tax import TAX_REFERENCE, TaxMeter, template_ids


@dataclass(frozen=True)
class Rollout:
    """One rollout batch: the completions of ``examples`` (G per prompt, grouped), their texts and rewards."""

    examples: list
    batch: RolloutBatch
    texts: list[str]
    rewards: RewardBatch
    sampler_logp: torch.Tensor  # (B, T) log pi_rollout(y_t) before top-k / top-p where the engine returns it, 0 on padding
    sampler_entropy: torch.Tensor  # (B, T) entropy of the distribution each token was sampled from
    stats: dict = field(default_factory=dict)
    """Dynamic sampling's ``rollout/dropped_groups`` and ``rollout/extra_batches`` ({} without it), ``reward/greedy``."""
    greedy_rewards: list[float] | None = None
    """ReMax's baseline: per completion, the total reward of its prompt's greedy completion (None unless the objective's
    advantage reads it); the greedy completions themselves are not in the batch and are not trained on."""

    def reward_tensor(self) -> torch.Tensor:
        """The total rewards (B,) float32."""
        return torch.tensor(self.rewards.total, dtype=torch.float32)

    def greedy_reward_tensor(self) -> torch.Tensor:
        """The greedy completions' rewards (B,) float32; ValueError when the rollout stage made none."""
        if self.greedy_rewards is None:
            raise ValueError("this rollout has no greedy completions: build the RolloutStage with greedy_baseline=True for remax")
        return torch.tensor(self.greedy_rewards, dtype=torch.float32)


def sampling_params(rollout_cfg, temperature: float) -> SamplingParams:
    """The engine's sampling parameters of the config at ``temperature`` (train and eval differ only there)."""
    r = rollout_cfg
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=temperature, top_p=r.top_p, top_k=r.top_k)


class RolloutStage:
    """Draws a step's prompts, samples and scores their groups (with dynamic sampling when configured), and
    evaluates on held-out prompts."""

    def __init__(
        self,
        cfg,
        *,
        device: torch.device,
        engine,
        tok,
        eos_ids: set[int],
        rewards,
        parallel: OneProcess,
        train_examples: list,
        eval_examples: list,
        max_prompt_tokens: int | None,
        greedy_baseline: bool = False,
        policy_model=None,
    ):
        self.greedy_baseline = greedy_baseline
        """Generate and score one greedy completion per prompt with every rollout (ReMax's baseline)."""
        self.cfg, self.device, self.engine, self.tok, self.eos_ids, self.rewards = cfg, device, engine, tok, eos_ids, rewards
        self.parallel, self.train_examples, self.max_prompt_tokens = parallel, train_examples, max_prompt_tokens
        self.prompts = PromptSampler(len(train_examples), cfg.seed, cfg.data.shuffle)
        """The seeded, resumable order of the train prompts (its state is checkpointed)."""
        self.eval_examples, self.eval_prompt_ids = eval_examples, self.encode(eval_examples)
        model = policy_model if policy_model is not None else getattr(engine, "model", None)
        self.tax = None
        """``eval/tax_kl``'s meter (None without the policy model: a vLLM engine and no ``policy_model``)."""
        if model is not None:
            templates = None
            if cfg.data.task in TEMPLATE_TASKS:  # the template's tokens after each eval prompt (eval/template_kl)
                templates = template_ids(tok, [answer_template(ex) for ex in eval_examples], [template_answer(ex) for ex in eval_examples])
            path = cfg.folder / TAX_REFERENCE
            self.tax = TaxMeter(model, self.eval_prompt_ids, path, device, writes=parallel.is_main, template_ids=templates)

    def encode(self, examples: list) -> list[list[int]]:
        """The prompts' token ids (template, chat template, length limit: ``prompts.encode_prompts``)."""
        return encode_prompts(self.tok, examples, self.cfg.data, self.max_prompt_tokens)

    def run(self, step: int, *, seed_per_group: bool) -> Rollout:
        """The rollout batch of training step ``step``: ``prompts_per_step`` groups of G completions."""
        examples = self.take(self.cfg.rollout.prompts_per_step)
        if self.cfg.rollout.dynamic_sampling:  # (the config check refuses it with a greedy baseline)
            return self.dynamic(examples, step, seed_per_group)
        rollout = self.assemble(*self.sample_and_score(examples, step, seed_per_group))
        return self.with_greedy_baseline(rollout) if self.greedy_baseline else rollout

    def with_greedy_baseline(self, rollout: Rollout) -> Rollout:
        """``rollout`` with ReMax's baseline (arXiv 2310.10505; verl's ``reward_baselines``): one greedy completion of every
        prompt from the policy that sampled the groups, scored by the same reward, its total repeated over the group.
        Each process decodes and scores its share of the prompts; the greedy completions leave no rows in the batch.
        Their reward calls' failures are counted with the group's (reward/errors, timeouts, invalid)."""
        cfg, examples = self.cfg, rollout.examples
        n, G = len(examples), cfg.rollout.group_size
        mine = self.parallel.my_share(n)
        local = [examples[g] for g in mine]
        with self.parallel.gathered():  # a different number of forwards on each process
            tokens = self.engine.sample(self.encode(local), 1, greedy_params(cfg.rollout.max_new_tokens)).tokens if local else []
        rew = self.rewards([ex.prompt for ex in local], self.tok.batch_decode(tokens, skip_special_tokens=True), local) if local else None
        per_prompt: list = [None] * n
        counts = {"errors": 0, "timeouts": 0, "invalid": 0}
        for part_mine, part_total, part_counts in self.parallel.gather_objects(
            (mine, [] if rew is None else rew.total, {k: 0 if rew is None else getattr(rew, k) for k in counts})
        ):
            for j, g in enumerate(part_mine):
                per_prompt[g] = part_total[j]
            for k in counts:
                counts[k] += part_counts[k]
        rewards = dataclasses.replace(rollout.rewards, **{k: getattr(rollout.rewards, k) + v for k, v in counts.items()})
        stats = {**rollout.stats, "reward/greedy": sum(per_prompt) / n}
        greedy = [per_prompt[g] for g in range(n) for _ in range(G)]  # (B,) group-major, as the batch
        return dataclasses.replace(rollout, rewards=rewards, stats=stats, greedy_rewards=greedy)

    def take(self, n: int) -> list:
        """The next ``n`` train examples of the prompt order."""
        return [self.train_examples[i] for i in self.prompts.take(n)]

    def sample_and_score(
        self, examples: list, step: int, seed_per_group: bool, draw: int = 0
    ) -> tuple[list, list[list[int]], Samples, list[str], RewardBatch]:
        """G completions of every example and their rewards, the whole batch on every process (each samples and
        scores its share). With per-group seeds group g of rollout draw ``draw`` samples from seed (seed, step, draw * n + g)."""
        cfg, G, n = self.cfg, self.cfg.rollout.group_size, len(examples)
        mine = self.parallel.my_share(n)  # this process's groups (all of them on one process)
        local, prompt_ids = [examples[g] for g in mine], self.encode(examples)
        local_ids = [prompt_ids[g] for g in mine]
        params = sampling_params(cfg.rollout, cfg.rollout.temperature)
        with self.parallel.gathered():  # sampling takes a different number of forwards on each process
            if seed_per_group:
                seeds = [row_seed(cfg.seed, step, draw * n + g) for g in mine]
                samples = self.engine.sample(local_ids, G, params, seeds=seeds)
            else:
                samples = self.engine.sample(local_ids, G, params)
        texts = self.tok.batch_decode(samples.tokens, skip_special_tokens=True)
        per_completion = [ex for ex in local for _ in range(G)]
        rewards = self.rewards([ex.prompt for ex in per_completion], texts, per_completion)
        samples, texts, rewards = self.parallel.gather_rollout(mine, samples, texts, rewards, n, G)
        return examples, prompt_ids, samples, texts, rewards

    def assemble(
        self,
        examples: list,
        prompt_ids: list[list[int]],
        samples: Samples,
        texts: list[str],
        rewards: RewardBatch,
        stats: dict | None = None,
    ) -> Rollout:
        """The rollout batch of sampled groups: ``build_batch``'s tensors and the sampler's log-probs laid out like them."""
        batch = build_batch(
            prompt_ids,
            samples.tokens,
            self.cfg.rollout.group_size,
            pad_id=self.tok.pad_token_id,
            eos_ids=self.eos_ids,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
        )
        logp, entropy = sampler_logp(samples, batch.mask.shape[1])
        stats = dict(stats or {})
        kept_mass = log_kept_mass(samples, batch.mask.shape[1], batch.mask) if truncates(sampling_params(self.cfg.rollout, 1.0)) else None
        if kept_mass is not None:
            stats["rollout/log_kept_mass"] = kept_mass
        return Rollout(examples, batch, texts, rewards, logp, entropy, stats)

    def dynamic(self, first_examples: list, step: int, seed_per_group: bool) -> Rollout:
        """DAPO's dynamic sampling: groups whose rewards are all equal carry no signal and are dropped; more
        prompts are drawn until ``prompts_per_step`` groups remain or ``rollout.max_extra_batches`` extra
        rollout batches were drawn (then the step trains on the groups it has). The rollout's ``stats``:
        ``rollout/dropped_groups``, ``rollout/extra_batches``."""
        G, want = self.cfg.rollout.group_size, self.cfg.rollout.prompts_per_step
        kept: list[tuple] = []  # (example, prompt ids, tokens, logprobs, entropies, texts, total, correct, format, untruncated, extra)
        counts = {"errors": 0, "timeouts": 0, "invalid": 0}
        dropped, extra, examples = 0, -1, first_examples
        while len(kept) < want and extra < self.cfg.rollout.max_extra_batches:
            extra += 1
            if extra:
                examples = self.take(want)
            exs, pids, smp, texts, rew = self.sample_and_score(examples, step, seed_per_group, draw=extra)
            for k in ("errors", "timeouts", "invalid"):
                counts[k] += getattr(rew, k)
            for g, ex in enumerate(exs):
                rows = range(g * G, (g + 1) * G)
                totals = [rew.total[i] for i in rows]
                if max(totals) == min(totals):
                    dropped += 1
                    continue
                pick = lambda seq, rows=rows: [seq[i] for i in rows]  # noqa: E731
                kept.append(
                    (
                        ex,
                        pids[g],
                        pick(smp.tokens),
                        pick(smp.logprobs),
                        pick(smp.entropies),
                        pick(texts),
                        totals,
                        pick(rew.correct),
                        pick(rew.format),
                        None if smp.logprobs_untruncated is None else pick(smp.logprobs_untruncated),
                        [pick(values) for values in rew.extra],
                    )
                )
        stats = {"rollout/dropped_groups": dropped, "rollout/extra_batches": extra}
        if not kept:  # not one informative group: train on the last draw as it is (all its advantages are 0)
            return self.assemble(exs, pids, smp, texts, rew, stats)
        kept = kept[:want]
        flat = lambda j: [x for group in kept for x in group[j]]  # noqa: E731
        samples = Samples(flat(2), flat(3), flat(4), None if any(g[9] is None for g in kept) else flat(9))
        extra = tuple([x for group in kept for x in group[10][k]] for k in range(len(kept[0][10])))  # reward.functions' values
        rewards = RewardBatch(flat(6), flat(7), flat(8), **counts, extra=extra)
        return self.assemble([g[0] for g in kept], [g[1] for g in kept], samples, flat(5), rewards, stats)

    def evaluate(self, step: int, *, seed_per_group: bool) -> dict:
        """avg@k (mean correctness over k samples of each eval prompt) and pass@k; RNG forked. Each process
        evaluates every world-th prompt; the correctness of all is gathered."""
        cfg, examples = self.cfg, self.eval_examples
        k = cfg.eval.k
        n = len(examples)
        mine = self.parallel.my_share(n)  # each process evaluates every world-th prompt
        mine_ids, params = [self.eval_prompt_ids[i] for i in mine], sampling_params(cfg.rollout, cfg.eval.temperature)
        completions: list[list[int]] = []
        with (
            self.parallel.gathered(),
            torch.random.fork_rng(devices=[torch.cuda.current_device()] if self.device.type == "cuda" else []),
        ):
            torch.manual_seed(cfg.seed * 7919 + step)
            if seed_per_group and mine_ids:
                completions = self.engine.sample(mine_ids, k, params, seeds=[row_seed(cfg.seed, 7919, step, i) for i in mine]).tokens
            elif mine_ids:
                completions = self.engine.generate(mine_ids, k, params)
            tax = {} if self.tax is None else self.tax.measure(step)  # every process scores every eval prompt: no gather
        texts = self.tok.batch_decode(completions, skip_special_tokens=True)
        exs = [examples[i] for i in mine for _ in range(k)]
        rew = self.rewards([e.prompt for e in exs], texts, exs) if exs else None
        rows: list = [None] * n
        for part_mine, part_correct in self.parallel.gather_objects((mine, [] if rew is None else rew.correct)):
            for j, i in enumerate(part_mine):
                rows[i] = part_correct[j * k : (j + 1) * k]
        correct = torch.tensor(rows, dtype=torch.float32).view(n, k)
        out = {"step": step, f"eval/avg@{k}": float(correct.mean()), f"eval/pass@{k}": float((correct > 0).any(1).float().mean())}
        out |= self.template_metrics("eval/template", [i for i in mine for _ in range(k)], texts)
        if cfg.eval.greedy and step in (0, cfg.train.steps):
            out |= self.greedy_eval()
        return out | tax

    def template_metrics(self, key: str, indices: list[int], texts: list[str]) -> dict:
        """{key: the share of ``texts`` (completions of the eval prompts ``indices``, this process's) that restate their
        problem's template}, over every process's; {} for a task without a template."""
        if self.cfg.data.task not in TEMPLATE_TASKS:
            return {}
        hits, total = 0.0, 0
        share = template_share(self.cfg.data.task, texts, [self.eval_examples[i] for i in indices]) if texts else None
        for part_share, part_n in self.parallel.gather_objects((share, len(texts))):
            if part_share is not None:
                hits, total = hits + part_share * part_n, total + part_n
        return {key: hits / total} if total else {}

    def greedy_eval(self) -> dict:
        """One greedy completion (temperature 0, ``greedy_params``) of every eval prompt: ``eval/greedy_acc``, the share
        correct, and for a template task ``eval/greedy_template``. Each process decodes every world-th prompt."""
        n = len(self.eval_examples)
        mine = self.parallel.my_share(n)
        with self.parallel.gathered():  # a different number of forwards on each process
            ids = [self.eval_prompt_ids[i] for i in mine]
            tokens = self.engine.sample(ids, 1, greedy_params(self.cfg.rollout.max_new_tokens)).tokens if ids else []
        texts = self.tok.batch_decode(tokens, skip_special_tokens=True)
        exs = [self.eval_examples[i] for i in mine]
        rew = self.rewards([e.prompt for e in exs], texts, exs) if exs else None
        correct = [c for part in self.parallel.gather_objects([] if rew is None else rew.correct) for c in part]
        return {"eval/greedy_acc": sum(correct) / n} | self.template_metrics("eval/greedy_template", mine, texts)
