"""Rollouts: KV-cache sampling from the student, the teacher, or a mixture.

  rollout = generate(student, teacher, prompts, prompt_mask, rng=key,
                     policy='mixture', lam=0.5, max_new_tokens=256)

See generation.py for the Rollout layout and loop.py for the RNG guarantees.
"""
from jaxdistill.rollout.generation import eos_ids
from jaxdistill.rollout.generation import generate
from jaxdistill.rollout.generation import mixture_lam
from jaxdistill.rollout.generation import POLICIES
from jaxdistill.rollout.generation import program
from jaxdistill.rollout.generation import Rollout
from jaxdistill.rollout.prompts import bucket_length
from jaxdistill.rollout.prompts import decode_responses
from jaxdistill.rollout.prompts import pad_prompts
from jaxdistill.rollout.prompts import response_token_ids
from jaxdistill.rollout.sampling import sample
from jaxdistill.rollout.sampling import Sampler
