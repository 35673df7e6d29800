"""dfpo's objectives inside other trainers: ``dfpo.integrations.trl`` (TRL's GRPOTrainer)."""
