"""Reinforcement learning with verifiable rewards (GRPO) on top of the
distillation stack: rl/grpo.py (advantages, objective), rl/step.py (one
iteration: collect + update), rl/train.py (the loop and its CLI)."""
