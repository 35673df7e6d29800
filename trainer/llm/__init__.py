"""Group-relative RL fine-tuning of transformers models with every objective of the loss core."""
