"""Toy lab: tabular softmax policies where learning tax and drift are measured exactly.

Modules (read in this order):

- ``tasks``   token-level automata: ``tenplusten`` (paper App. A) and the parametric ``family``;
              enumeration of every completion.
- ``policy``  the tabular softmax policy, batched over seeds (S, R, V): sampling, log-probs,
              the closed-form table gradient.
- ``train``   rollouts -> ``group_advantages`` -> K optimiser steps through ``dfpo.policy_loss``;
              ``sampled`` and ``exact`` (infinite-group) modes; per-step metrics.
- ``metrics`` exact policy metrics, mechanism metrics (eq 2, 23, 24), Jitter2 (eq 20),
              Steps (eq 19).
- ``report``  run folders: metrics JSONL/CSV, summary.md with the paper checks, PNG curves.
- ``metric_names`` logged keys that changed name (older run folders are read under today's names).
- ``sweep``   the group-size sweep (the toy's Table 4).
- ``cli``     ``dfpo toy run`` and ``dfpo toy sweep-g``.

Per-step metric keys (each a value per seed). A quantity the LLM trainer logs too carries the
trainer's name from ``dfpo.core.metric_registry`` (``reward/mean``, ``weights/asym``, the clip
fractions), so toy and trainer runs share their charts in the explorer; the others are the toy's own.

| key | meaning |
|---|---|
| reward | exact expected reward E[R] (enumeration; the sampled mean when the task is too big) |
| reward/mean | mean reward of the rollout batch (pi_old-weighted in exact mode); older runs logged it as reward/sampled |
| tax/kl_step, tax/kl_cum, tax/kl_init | KL(pi_new or pi_now || pi_old or pi_init) averaged over template rows (Prop. 3.1) |
| grad/template | norm of the loss gradient on the template rows (mean over the K updates) |
| residual/shared, residual/shared_rel | gradient left on context-token pairs shared by a whole group (eq 2), absolute and net/gross |
| equiv/logodds, equiv/entropy | log P(form 0) - log P(form 1) and the entropy over the correct answer forms (Cor. 3.2) |
| entropy/sequence, entropy/token | H(pi(y|x)) and the mean entropy of the template rows |
| asym | eq 23 with the effective coefficient w_i A_i read off the gradient |
| energy/frequent | eq 24, share of per-token gradient norm on tokens present in >= half of the completions |
| clip/frac_low, clip/frac_high | the loss core's clip fractions, pooled over seeds |
| weights/asym | the loss core's eq 23 (post-clip weights, as the trainer logs it), pooled over seeds; sampled mode only |
| update/norm | Euclidean norm of the parameter change of a rollout batch (its K optimiser steps together): the effective step size |
"""
