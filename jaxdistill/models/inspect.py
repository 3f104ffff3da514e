"""Loads a HF checkpoint directory and runs one short prompt through it.

  python -m jaxdistill.models.inspect /path/to/Llama-3.2-1B-Instruct
  python -m jaxdistill.models.inspect meta-llama/Llama-3.2-1B-Instruct   # hub
  python -m jaxdistill.models.inspect            # a tiny random Llama 3, saved
                                                  # with save_pretrained first

Prints the family, parameter count and the logits' shape as JSON. Token ids
are fixed (no tokenizer needed); a hub name is fetched into (or found in) the
Hugging Face cache (models.hub) and its commit printed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile

import jax
import jax.numpy as jnp

from jaxdistill import cli
from jaxdistill import models
from jaxdistill.models import hub


def tiny_llama_config() -> models.ModelConfig:
  return dataclasses.replace(
      models.get_preset("llama-3.2-1b"), vocab_size=512, hidden_size=64,
      intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, head_dim=16, dtype="float32",
      param_dtype="float32", bos_token_id=1, eos_token_id=(2,))  # in its vocab


def inspect(path: str, dtype=None) -> dict:
  """Family, size and one forward pass of a checkpoint directory or hub name
  (a training workdir is refused, naming its hf_student/)."""
  local = hub.checkpoint_dir(path, "models.inspect PATH")
  cfg, params = models.load_pretrained(local, dtype=dtype)
  prompt = jnp.asarray([[cfg.bos_token_id or 0, 5, 6, 7, 8, 9, 10, 11]],
                       jnp.int32) % cfg.vocab_size
  logits = jax.jit(models.apply, static_argnums=0)(cfg, params, prompt)
  return {
      "path": str(path),
      "revision": hub.resolve(path)[1],
      "family": cfg.family,
      "num_params": models.num_params(params),
      "dtype": cfg.dtype,
      "prompt_shape": list(prompt.shape),
      "logits_shape": list(logits.shape),
      "next_token": int(jnp.argmax(logits[0, -1])),
  }


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("path", nargs="?",
                  help="HF checkpoint directory or hub name org/name[@rev]")
  ap.add_argument("--dtype", default=None, help="float32 | bfloat16")
  args = ap.parse_args(argv)
  if args.path:
    print(json.dumps(inspect(args.path, args.dtype)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    cfg = tiny_llama_config()
    models.save_pretrained(cfg, models.init(cfg, jax.random.key(0)), tmp)
    print(f"wrote a tiny random Llama 3 checkpoint to {tmp}", file=sys.stderr)
    print(json.dumps(inspect(tmp, args.dtype)))


if __name__ == "__main__":
  cli.run(main)
