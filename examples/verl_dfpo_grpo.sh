#!/usr/bin/env bash
# verl's GRPO recipe (GSM8K, one node of 8 GPUs) with a dfpo objective as the policy loss.
#
# In verl's environment, with dfpo installed beside it (pip install --no-deps dfpo, or -e this repository):
# verl loads dfpo's losses itself in every process (dfpo's "verl.plugins" entry point), so the only change to
# the recipe is the loss_mode, plus the four settings that keep each group of rollout.n completions in one
# loss call (dfpo.integrations.verl.check_groups_stay_whole refuses anything else):
#   ppo_micro_batch_size_per_gpu a multiple of rollout.n, use_dynamic_bsz=False, shuffle=False,
#   trainer.balance_batch=False.
# Data: verl's examples/data_preprocess/gsm8k.py writes the two parquet files. Extra overrides: "$@".
# scripts/verl_check.py composes verl's own config with these lines and checks them (CI, no GPU needed).
set -euo pipefail
DATA=${DATA:-$HOME/data/gsm8k}
MODEL=${MODEL:-Qwen/Qwen3-0.6B}
LOSS=${LOSS:-dfpo_min}

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files=$DATA/train.parquet \
    data.val_files=$DATA/test.parquet \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path=$MODEL \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.policy_loss.loss_mode=$LOSS \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_dynamic_bsz=False \
    actor_rollout_ref.actor.shuffle=False \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
    trainer.balance_batch=False \
    trainer.critic_warmup=0 \
    trainer.logger=console \
    trainer.project_name=dfpo_verl_gsm8k \
    trainer.experiment_name=$LOSS \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 "$@"
