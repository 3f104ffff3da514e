"""Rollouts: KV-cache sampling from the student, the teacher, or both.

  rollout = generate(student, teacher, prompts, prompt_mask, rng=key,
                     policy='spectrum', lam=0.5, max_new_tokens=256,
                     temperature=1.0, teacher_temperature=0.5)

'spectrum' is the paper's pi_lambda (spectrum.py: lam = -1 the teacher, +1 the
student); 'coin_mixture' picks each token from the student with probability
lam in [0, 1], a different method.

See generation.py for the Rollout layout and loop.py for the RNG guarantees.
"""
from jaxdistill.rollout.generation import decode_weight_bytes
from jaxdistill.rollout.generation import eos_ids
from jaxdistill.rollout.generation import generate
from jaxdistill.rollout.generation import policy_lam
from jaxdistill.rollout.generation import POLICIES
from jaxdistill.rollout.generation import program
from jaxdistill.rollout.generation import sampling_policy
from jaxdistill.rollout.generation import Rollout
from jaxdistill.rollout.prompts import bucket_length
from jaxdistill.rollout.prompts import decode_responses
from jaxdistill.rollout.prompts import pad_prompts
from jaxdistill.rollout.prompts import response_token_ids
from jaxdistill.rollout.sampling import sample
from jaxdistill.rollout.sampling import Sampler
from jaxdistill.rollout.spectrum import spectrum_logprobs
from jaxdistill.rollout import spectrum
from jaxdistill.rollout.generation import TWO_MODEL_POLICIES
