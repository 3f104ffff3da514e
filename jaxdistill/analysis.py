r"""KL-gradient analysis: what forward and reverse KL ask of the student logits.

For rollouts (tokens + masks) from some policy and a (student, teacher) pair,
at every response position, with q = softmax(z / tau) (student), p =
softmax(u / tau) (teacher) over the shared vocabulary (docs/method.md):

  g_F = dFKL/dz = (q - p) / tau
  g_R = dRKL/dz = q (log q - log p - RKL) / tau

and per token: ||g_F||, ||g_R|| (L2), cos(g_F, g_R), and the share of each
gradient's mass on entries where the student under-estimates the teacher
(q < p) and over-estimates it (q > p); equal entries (q == p) are in neither.
Mass is the squared norm, sum_v g_v^2: a gradient w.r.t. logits sums to zero
(softmax ignores a constant shift), so its L1 mass always splits 1/2 : 1/2
by sign, and for g_F the sign is exactly that of q - p: L1 shares would say
nothing about forward KL.
Summaries are means over response tokens. Along the rollout spectrum
(the paper's pi_lambda, lambda in [-2, 2]: -1 teacher, +1 student) this gives one row per lambda:

  python -m jaxdistill.analysis --config configs/distill.py:runlocal \
      --lams=-2,-1,0,1,2 --batches 2 --out /tmp/kl_grads
  python -m jaxdistill.analysis --config configs/distill.py:kl=reverse \
      --config.student.path=/runs/x/hf_student --config.teacher.path=/ckpt/T \
      --out /runs/x/kl_grads

With loss.teacher_topk = k (e.g. configs/distill.py:topk=64) each row also
holds, per direction, the mean cosine and norm ratio between the gradient of
the top-k loss (loss.topk_variant) and the exact one (TOPK_STATS).

Writes kl_gradients.csv, kl_gradients.md and kl_gradients.png to --out and
prints the rows as one JSON list. Memory: the per-token gradients are
[T, V] per sequence (the batch is mapped row by row), so keep T x V modest.
"""
from __future__ import annotations

from collections.abc import Sequence
import csv
import json
import logging
import os
import sys

from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags

from jaxdistill import cli
from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill.models import hub
from jaxdistill.train import setup as train_setup

STATS = ("fkl", "rkl", "fkl_norm", "rkl_norm", "cos", "fkl_under", "fkl_over",
         "rkl_under", "rkl_over")
# With a teacher top-k (loss.teacher_topk): per direction, the cosine and the
# norm ratio ||g_topk|| / ||g_exact|| between the gradient of the top-k loss
# (losses.topk_divergence) and the exact one, w.r.t. the student logits.
TOPK_STATS = ("fkl_topk_cos", "fkl_topk_norm_ratio", "rkl_topk_cos",
              "rkl_topk_norm_ratio")


def _check(student_logits, teacher_logits, vocab_size, temperature):
  zs, us = student_logits.shape, teacher_logits.shape
  if zs[:-1] != us[:-1]:
    raise ValueError(f"student_logits {zs} and teacher_logits {us}: leading "
                     "shapes differ")
  v = vocab_size or min(zs[-1], us[-1])
  if zs[-1] != us[-1] and not vocab_size:
    raise ValueError(f"vocab_size: student ({zs[-1]}) and teacher ({us[-1]}) "
                     "vocabularies differ; pass the shared real vocabulary")
  if v > min(zs[-1], us[-1]):
    raise ValueError(f"vocab_size: {v} exceeds the logits' vocabularies {zs[-1]}, "
                     f"{us[-1]}")
  if not float(temperature) > 0:
    raise ValueError(f"temperature: must be > 0, got {temperature}")
  return int(v)


def kl_gradients(student_logits, teacher_logits, *, temperature=1.0,
                 teacher_temperature=None, vocab_size=None) -> dict:
  """Closed-form per-token gradients w.r.t. the student logits (those the
  losses back-propagate: losses.logit_gradient).

  [..., V] logits -> {'fkl_grad', 'rkl_grad': [..., V'], 'q', 'p': [..., V'],
  'fkl', 'rkl': [...]}, V' = the shared vocabulary; float32. The student at
  `temperature`, the teacher at `teacher_temperature` (default the same).
  """
  v = _check(student_logits, teacher_logits, vocab_size, temperature)
  tau = float(temperature)
  tau_t = tau if teacher_temperature is None else float(teacher_temperature)
  kw = dict(temperature=tau, teacher_temperature=tau_t, vocab_size=v)
  g_f, terms = losses.logit_gradient(student_logits, teacher_logits,
                                     kind="forward", **kw)
  g_r, _ = losses.logit_gradient(student_logits, teacher_logits,
                                 kind="reverse", **kw)
  # The two distributions, for the statistics that compare them (q < p).
  q, p = (jnp.exp(jax.nn.log_softmax(x[..., :v].astype(jnp.float32) / t, -1))
          for x, t in ((student_logits, tau), (teacher_logits, tau_t)))
  return {"fkl_grad": g_f, "rkl_grad": g_r, "q": q, "p": p,
          "fkl": terms["fkl"], "rkl": terms["rkl"]}


def _shares(g, under, over):
  mass = jnp.square(g)
  tot = mass.sum(-1)
  safe = jnp.where(tot > 0, tot, 1.0)
  return (jnp.where(tot > 0, (mass * under).sum(-1) / safe, 0.0),
          jnp.where(tot > 0, (mass * over).sum(-1) / safe, 0.0))


def _cos(a, b):
  na, nb = jnp.linalg.norm(a, axis=-1), jnp.linalg.norm(b, axis=-1)
  return jnp.sum(a * b, -1) / jnp.maximum(na * nb, 1e-30), na, nb


def topk_gradients(student_logits, teacher_logits, *, k, variant="renorm",
                   temperature=1.0, teacher_temperature=None,
                   vocab_size=None) -> dict:
  """Closed-form per-token gradients of the top-k forward and reverse KL
  (losses.topk) w.r.t. the student logits: {'fkl_grad', 'rkl_grad'} [..., V']."""
  v = _check(student_logits, teacher_logits, vocab_size, temperature)
  tau = float(temperature)
  tau_t = tau if teacher_temperature is None else float(teacher_temperature)
  t = losses.teacher_topk(teacher_logits[..., :v], int(k), temperature=tau_t)
  return {name: losses.topk_logit_gradient(
              student_logits, t.ids, t.logprobs, kind=kind, temperature=tau,
              vocab_size=v, variant=variant, teacher_tail=t.tail)[0]
          for kind, name in (("forward", "fkl_grad"), ("reverse", "rkl_grad"))}


def token_stats(student_logits, teacher_logits, *, temperature=1.0,
                teacher_temperature=None, vocab_size=None, topk=None,
                topk_variant="renorm") -> dict:
  """Per-token statistics ([...] each, keys STATS, and TOPK_STATS when `topk`
  is set) of the two gradients."""
  g = kl_gradients(student_logits, teacher_logits, temperature=temperature,
                   teacher_temperature=teacher_temperature,
                   vocab_size=vocab_size)
  gf, gr = g["fkl_grad"], g["rkl_grad"]
  under, over = g["q"] < g["p"], g["q"] > g["p"]
  nf, nr = jnp.linalg.norm(gf, axis=-1), jnp.linalg.norm(gr, axis=-1)
  cos = jnp.sum(gf * gr, -1) / jnp.maximum(nf * nr, 1e-30)
  out = {"fkl": g["fkl"], "rkl": g["rkl"], "fkl_norm": nf, "rkl_norm": nr,
         "cos": cos}
  out["fkl_under"], out["fkl_over"] = _shares(gf, under, over)
  out["rkl_under"], out["rkl_over"] = _shares(gr, under, over)
  if topk is not None:
    gk = topk_gradients(student_logits, teacher_logits, k=topk,
                        variant=topk_variant, temperature=temperature,
                        teacher_temperature=teacher_temperature,
                        vocab_size=vocab_size)
    for d, exact in (("fkl", gf), ("rkl", gr)):
      cos_k, n_k, n_e = _cos(gk[f"{d}_grad"], exact)
      out[f"{d}_topk_cos"] = cos_k
      out[f"{d}_topk_norm_ratio"] = n_k / jnp.maximum(n_e, 1e-30)
  return out


def summarize(stats: dict, mask) -> dict:
  """Means over the positions where mask != 0, and the token count."""
  m = jnp.asarray(mask != 0, jnp.float32)
  n = jnp.maximum(m.sum(), 1.0)
  out = {k: jnp.sum(jnp.where(m > 0, v, 0.0)) / n for k, v in stats.items()}
  out["tokens"] = m.sum()
  return out


def analyze_batch(student, teacher, tokens, attention_mask, loss_mask, *,
                  temperature=1.0, teacher_temperature=None, vocab_size=None,
                  topk=None, topk_variant="renorm") -> dict:
  """Summary statistics of one rollout batch.

  student / teacher: (ModelConfig, params). tokens, attention_mask,
  loss_mask: [B, L] as in jaxdistill.train.step (logits at t predict token t + 1,
  so the statistics at t count where loss_mask[t + 1] is set).
  """
  tokens = jnp.asarray(tokens)
  if tokens.ndim != 2 or attention_mask.shape != tokens.shape or \
      loss_mask.shape != tokens.shape:
    raise ValueError(f"tokens {tokens.shape}, attention_mask "
                     f"{attention_mask.shape}, loss_mask {loss_mask.shape}: "
                     "expected equal [B, L] shapes")
  (scfg, sp), (tcfg, tp) = student, teacher
  mask = jnp.asarray(loss_mask)[:, 1:]

  def row(args):
    tok, att = args
    z = models.apply(scfg, sp, tok[None], att[None])[0, :-1]  # [L-1, V_s]
    u = models.apply(tcfg, tp, tok[None], att[None])[0, :-1]  # [L-1, V_t]
    return token_stats(z, u, temperature=temperature,
                       teacher_temperature=teacher_temperature,
                       vocab_size=vocab_size, topk=topk,
                       topk_variant=topk_variant)

  stats = jax.lax.map(row, (tokens, jnp.asarray(attention_mask)))  # [B, L-1]
  return {k: float(v) for k, v in jax.device_get(summarize(stats, mask)).items()}


def _check_lams(lams) -> None:
  if not lams:
    raise ValueError("lams: need at least one lambda")
  bad = [l for l in lams if not -2.0 <= float(l) <= 2.0]
  if bad:
    raise ValueError(f"lams: the paper's lambda lies in [-2, 2] (-1 teacher, "
                     f"+1 student), got {bad}")


def lambda_spectrum(student, teacher, prompt_batches: Sequence[dict], *,
                    lams: Sequence[float], rng, max_new_tokens: int,
                    temperature: float = 1.0, teacher_temperature=None,
                    vocab_size=None, eos_token_ids=None,
                    pad_token_id: int = 0, topk=None,
                    topk_variant: str = "renorm") -> list[dict]:
  """One row per lambda: rollouts from the paper's pi_lambda (policy
  'spectrum') on the same prompts, each model at its own temperature (also
  inside the statistics).

  prompt_batches: host batches with 'prompt' and 'prompt_mask' ([B, P]).
  Rows hold the token-weighted means of STATS over all batches, the realised
  student fraction, the number of tokens and lambda; with `topk` also
  TOPK_STATS (the top-k loss's gradient against the exact one).
  """
  _check_lams(lams)
  keys = STATS + (TOPK_STATS if topk is not None else ())
  rows = []
  for lam in lams:
    tot, acc, frac = 0.0, {k: 0.0 for k in keys}, 0.0
    for i, b in enumerate(prompt_batches):
      # Same key per batch across lambdas: arms differ only in lambda.
      r = rollout_lib.generate(
          student, teacher, jnp.asarray(b["prompt"]), jnp.asarray(b["prompt_mask"]),
          rng=jax.random.fold_in(rng, i), policy="spectrum", lam=float(lam),
          max_new_tokens=int(max_new_tokens), temperature=float(temperature),
          teacher_temperature=teacher_temperature,
          eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
          return_logprobs=False, vocab_size=vocab_size)
      s = analyze_batch(student, teacher, r.tokens, r.attention_mask,
                        r.loss_mask, temperature=temperature,
                        teacher_temperature=teacher_temperature,
                        vocab_size=vocab_size, topk=topk,
                        topk_variant=topk_variant)
      n = s["tokens"]
      tot += n
      frac += float(r.student_fraction) * n
      for k in keys:
        acc[k] += s[k] * n
    row = {"lam": float(lam), "tokens": tot,
           "student_fraction": frac / max(tot, 1.0)}
    row.update({k: v / max(tot, 1.0) for k, v in acc.items()})
    rows.append(row)
  return rows


PLUMBING_NOTE = ("random models (a preset or init, no checkpoint): a plumbing "
                 "check of the analysis, its numbers say nothing about "
                 "distillation")


def write_spectrum(rows: Sequence[dict], out_dir: str, *,
                   note: str | None = None) -> list[str]:
  """kl_gradients.csv / .md / .png of `lambda_spectrum` rows.

  `note` (e.g. PLUMBING_NOTE) heads the Markdown and titles the figure. The
  figure's axes span the quantities' ranges (shares [0, 1], cosine [-1, 1],
  norms from 0), so that noise between lambdas is not drawn as a trend."""
  if not rows:
    raise ValueError("rows: nothing to write")
  os.makedirs(out_dir, exist_ok=True)
  cols = ["lam", "student_fraction", "tokens", *STATS]
  cols += [k for k in TOPK_STATS if k in rows[0]]
  paths = [os.path.join(out_dir, f"kl_gradients.{e}") for e in ("csv", "md", "png")]
  with open(paths[0], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(cols)
    for r in rows:
      w.writerow([r[c] for c in cols])
  lines = [f"**Note: {note}.**", ""] if note else []
  lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  lines += ["| " + " | ".join(f"{r[c]:.4g}" for c in cols) + " |" for r in rows]
  lines += ["", "fkl/rkl: mean token KL; *_norm: mean L2 norm of the gradient "
            "w.r.t. the student logits; cos: mean cosine between the two; "
            "*_under / *_over: mean share of the gradient's squared norm on "
            "entries where q < p / q > p."]
  if "fkl_topk_cos" in rows[0]:
    lines[-1] += (" *_topk_cos / *_topk_norm_ratio: mean cosine and norm "
                  "ratio ||g_topk|| / ||g_exact|| between the gradient of the "
                  "loss on the teacher's top-k and the exact one.")
  with open(paths[1], "w") as f:
    f.write("\n".join(lines) + "\n")
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  lam = [r["lam"] for r in rows]
  fig, ax = plt.subplots(1, 3, figsize=(13, 3.5))
  for k, label in (("fkl_norm", "forward KL"), ("rkl_norm", "reverse KL")):
    ax[0].plot(lam, [r[k] for r in rows], "o-", label=label)
  ax[0].set_ylabel("mean ||grad|| w.r.t. logits")
  top = max([r[k] for r in rows for k in ("fkl_norm", "rkl_norm")] + [0.0])
  ax[0].set_ylim(0.0, 1.1 * top if top > 0 else 1.0)
  ax[1].plot(lam, [r["cos"] for r in rows], "o-")
  ax[1].set_ylabel("cos(grad FKL, grad RKL)")
  ax[1].set_ylim(-1.05, 1.05)
  for k, label in (("fkl_under", "forward KL, q < p"),
                   ("rkl_under", "reverse KL, q < p"),
                   ("fkl_over", "forward KL, q > p"),
                   ("rkl_over", "reverse KL, q > p")):
    ax[2].plot(lam, [r[k] for r in rows], "o-" if "under" in k else "s--",
               label=label)
  ax[2].set_ylabel("share of squared gradient norm")
  ax[2].set_ylim(-0.02, 1.02)
  for a in ax:
    a.set_xlabel("lambda (share of student tokens)")
    a.set_xlim(-0.05, 1.05)
  ax[0].legend(fontsize=8)
  ax[2].legend(fontsize=7)
  fig.suptitle("KL gradients w.r.t. the student logits along the rollout "
               "spectrum" + (f"\n({note})" if note else ""))
  fig.tight_layout()
  fig.savefig(paths[2], dpi=120)
  plt.close(fig)
  return paths


def run(config, lams: Sequence[float], *, batches: int = 1, out_dir: str | None = None,
        devices=None) -> list[dict]:
  """The spectrum for a training config's student, teacher and prompts."""
  if int(batches) < 1:
    raise ValueError(f"--batches: must be >= 1, got {batches}")
  _check_lams(lams)
  if out_dir:
    cli.check_out_dir(out_dir, "--out")
  config_lib.validate(config)
  config_lib.validate_run(config)
  mesh = sharding.make_mesh(dict(config.mesh), devices=devices)
  rules = sharding.rules_from_config(config)
  scfg, tcfg, tok, vocab, data = train_setup.pair_and_batches(config)
  config_lib.check_fits(config, {"student": scfg, "teacher": tcfg}, vocab)
  key = jax.random.key(config.seed)
  s_key, t_key = train_setup.init_keys(config.seed)
  sp = train_setup.load_params(scfg, config.student, mesh, rules, s_key)
  tp = train_setup.load_params(tcfg, config.teacher, mesh, rules, t_key,
                              "teacher")
  rows = lambda_spectrum(
      (scfg, sp), (tcfg, tp), [data[i] for i in range(int(batches))], lams=lams,
      rng=jax.random.fold_in(key, 7), max_new_tokens=int(config.rollout.max_new_tokens),
      temperature=config_lib.temperatures(config)[0],
      teacher_temperature=config_lib.temperatures(config)[1], vocab_size=vocab,
      eos_token_ids=rollout_lib.eos_ids(scfg, tcfg, tokenizer=tok),
      pad_token_id=getattr(tok, "pad_token_id", None) or 0,
      topk=config.loss.get("teacher_topk"),
      topk_variant=config.loss.get("topk_variant", "renorm"))
  note = None
  if not (hub.weights_spec(config.student) and hub.weights_spec(config.teacher)):
    note = PLUMBING_NOTE
    logging.warning("%s", note)
  if out_dir:
    write_spectrum(rows, out_dir, note=note)
  return rows


def main(argv):
  del argv
  f = flags.FLAGS
  lams = [float(x) for x in f.lams.split(",") if x.strip()]
  rows = run(f.config, lams, batches=f.batches, out_dir=f.out)
  print(json.dumps(rows))
  sys.stdout.flush()


def _define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "Training config (student, teacher, prompts, sampler).",
      lock_config=True)
  flags.DEFINE_string("lams", "-2,-1,0,1,2", "Comma-separated lambdas of the paper's spectrum (-1 teacher, +1 student).")
  flags.DEFINE_integer("batches", 1, "Prompt batches per lambda.")
  flags.DEFINE_string("out", None, "Directory for the CSV, Markdown and PNG.")
  flags.mark_flags_as_required(["config"])


if __name__ == "__main__":
  cli.run_absl(main, _define_flags)
