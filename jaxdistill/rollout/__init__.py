"""Rollouts: KV-cache sampling from the student, the teacher, or a mixture.

  rollout = generate(student, teacher, prompts, prompt_mask, rng=key,
                     policy='mixture', lam=0.5, max_new_tokens=256)

See generation.py for the Rollout layout and loop.py for the RNG guarantees.
"""
from jaxdistill.rollout.generation import POLICIES, Rollout, generate
from jaxdistill.rollout.prompts import (bucket_length, decode_responses,
                                        pad_prompts, response_token_ids)
from jaxdistill.rollout.sampling import Sampler, sample
