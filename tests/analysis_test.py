"""KL-gradient analysis: closed forms vs autodiff of a plain formula, shares vs NumPy."""
import dataclasses
import pathlib
import sys

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from jaxdistill import analysis
from jaxdistill import models
from jaxdistill import rollout

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from configs import distill  # pylint: disable=g-import-not-at-top,wrong-import-position


def _logits(seed, shape, scale=2.0):
  return jnp.asarray(np.random.default_rng(seed).normal(0, scale, shape),
                     jnp.float32)


def _plain_kl_sum(z, u, tau, kind):
  """Sum over positions of the per-token KL, written out with jax.nn (not
  jaxdistill.losses, whose closed form analysis uses): its autodiff gradient
  at a position is that token's own KL gradient."""
  logq = jax.nn.log_softmax(z / tau, -1)
  logp = jax.nn.log_softmax(u / tau, -1)
  if kind == "fkl":
    return jnp.sum(jnp.exp(logp) * (logp - logq))
  return jnp.sum(jnp.exp(logq) * (logq - logp))


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_closed_forms_equal_autodiff_of_the_plain_formula(tau):
  z, u = _logits(0, (2, 5, 11)), _logits(1, (2, 5, 11))
  g = analysis.kl_gradients(z, u, temperature=tau)
  for kind in ("fkl", "rkl"):
    auto = jax.grad(_plain_kl_sum)(z, u, tau, kind)
    np.testing.assert_allclose(g[f"{kind}_grad"], auto, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(  # the values too
        g[kind].sum(), _plain_kl_sum(z, u, tau, kind), rtol=1e-5)


def test_shared_vocabulary_only():
  z, u = _logits(2, (3, 9)), _logits(3, (3, 12))
  with pytest.raises(ValueError, match="vocab_size"):
    analysis.kl_gradients(z, u)
  g = analysis.kl_gradients(z, u, vocab_size=7)
  auto = jax.grad(_plain_kl_sum)(z[:, :7], u[:, :7], 1.0, "fkl")
  np.testing.assert_allclose(g["fkl_grad"], auto, rtol=1e-5, atol=1e-6)


def _numpy_stats(z, u, tau):
  z, u = np.asarray(z, np.float64) / tau, np.asarray(u, np.float64) / tau
  q = np.exp(z - z.max(-1, keepdims=True)); q /= q.sum(-1, keepdims=True)
  p = np.exp(u - u.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
  rkl = (q * np.log(q / p)).sum(-1, keepdims=True)
  gf, gr = (q - p) / tau, q * (np.log(q) - np.log(p) - rkl) / tau
  out = {}
  for name, g in (("fkl", gf), ("rkl", gr)):
    out[f"{name}_norm"] = np.sqrt((g ** 2).sum(-1))
    out[f"{name}_under"] = (g ** 2 * (q < p)).sum(-1) / (g ** 2).sum(-1)
    out[f"{name}_over"] = (g ** 2 * (q > p)).sum(-1) / (g ** 2).sum(-1)
  out["cos"] = (gf * gr).sum(-1) / (out["fkl_norm"] * out["rkl_norm"])
  return out


def test_token_stats_and_shares_equal_numpy():
  z, u = _logits(4, (4, 6, 13)), _logits(5, (4, 6, 13))
  got = analysis.token_stats(z, u, temperature=0.8)
  ref = _numpy_stats(z, u, 0.8)
  for k, v in ref.items():
    np.testing.assert_allclose(got[k], v, rtol=2e-4, atol=1e-5, err_msg=k)
  # Masked summary = NumPy mean over the kept tokens.
  mask = np.random.default_rng(6).random((4, 6)) < 0.6
  s = analysis.summarize(got, jnp.asarray(mask))
  np.testing.assert_allclose(s["fkl_under"], ref["fkl_under"][mask].mean(),
                             rtol=1e-5)
  assert int(s["tokens"]) == mask.sum()
  # Why squared mass: the L1 mass of the forward-KL gradient always splits
  # evenly (it sums to zero and has the sign of q - p).
  gf = np.asarray(analysis.kl_gradients(z, u, temperature=0.8)["fkl_grad"], np.float64)
  np.testing.assert_allclose(np.abs(gf * (gf < 0)).sum(-1),
                             np.abs(gf * (gf > 0)).sum(-1), rtol=1e-4, atol=1e-7)
  assert not np.allclose(ref["fkl_under"], 0.5, atol=1e-3)


def _numpy_topk_cos_ratio(z, u, tau, k):
  """Cosine and norm ratio of the renormalised top-k KL gradients against the
  exact ones, in float64 from the closed forms (restricted to the top-k)."""
  z, u = np.asarray(z, np.float64) / tau, np.asarray(u, np.float64) / tau
  sm = lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(
      x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
  q, p = sm(z), sm(u)
  on = np.zeros(z.shape, bool)
  np.put_along_axis(on, np.argsort(-u, -1)[..., :k], True, -1)
  qk = np.where(on, q, 0) / np.where(on, q, 0).sum(-1, keepdims=True)
  pk = np.where(on, p, 0) / np.where(on, p, 0).sum(-1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    lr = np.where(on, np.log(qk) - np.log(pk), 0.0)
    lr_full = np.log(q) - np.log(p)
  gk = {"fkl": (qk - pk) / tau,
        "rkl": qk * (lr - (qk * lr).sum(-1, keepdims=True)) / tau}
  ge = {"fkl": (q - p) / tau,
        "rkl": q * (lr_full - (q * lr_full).sum(-1, keepdims=True)) / tau}
  out = {}
  for d in ("fkl", "rkl"):
    na, nb = (np.sqrt((g[d] ** 2).sum(-1)) for g in (gk, ge))
    out[f"{d}_topk_cos"] = (gk[d] * ge[d]).sum(-1) / (na * nb)
    out[f"{d}_topk_norm_ratio"] = na / nb
  return out


def test_topk_gradient_cosine_and_norm_ratio_equal_numpy():
  z, u = _logits(7, (3, 4, 13)), _logits(8, (3, 4, 13))
  got = analysis.token_stats(z, u, temperature=0.8, topk=5)
  ref = _numpy_topk_cos_ratio(z, u, 0.8, 5)
  for k, v in ref.items():
    np.testing.assert_allclose(got[k], v, rtol=2e-4, atol=1e-5, err_msg=k)
  assert np.all(np.asarray(got["fkl_topk_cos"]) < 0.9999)  # k < V differs
  full = analysis.token_stats(z, u, temperature=0.8, topk=13,
                              topk_variant="tail")
  for k in analysis.TOPK_STATS:  # k = V: the exact gradient
    np.testing.assert_allclose(full[k], 1.0, rtol=1e-4, err_msg=k)


@pytest.mark.slow
def test_spectrum_on_tiny_models_writes_table_and_figure(tmp_path):
  base = models.ModelConfig()
  tiny = dict(family="llama", vocab_size=64, hidden_size=16,
              intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, head_dim=8, eos_token_id=(2,),
              max_position_embeddings=64, dtype="float32",
              param_dtype="float32")
  scfg = dataclasses.replace(base, **tiny)
  tcfg = dataclasses.replace(base, **dict(tiny, hidden_size=32))
  sp = models.init(scfg, jax.random.key(0))
  tp = models.init(tcfg, jax.random.key(1))
  rs = np.random.default_rng(0)
  batch = {"prompt": rs.integers(3, 64, (2, 4)).astype(np.int32),
           "prompt_mask": np.ones((2, 4), np.int32)}
  rows = analysis.lambda_spectrum((scfg, sp), (tcfg, tp), [batch],
                                  lams=(-1.0, 1.0), rng=jax.random.key(0),
                                  max_new_tokens=3, eos_token_ids=(2,),
                                  topk=8)
  assert [r["lam"] for r in rows] == [-1.0, 1.0]
  for r in rows:  # the top-k gradient against the exact one, per direction
    assert -1 <= r["rkl_topk_cos"] <= 1 and r["fkl_topk_norm_ratio"] > 0
  assert rows[0]["student_fraction"] == 0.0 and rows[1]["student_fraction"] == 1.0
  for r in rows:
    assert r["tokens"] > 0
    assert 0.0 <= r["fkl_under"] + r["fkl_over"] <= 1.0 + 1e-6
  paths = analysis.write_spectrum(rows, str(tmp_path))
  assert all((tmp_path / p).exists() for p in paths)
  assert "rkl_topk_norm_ratio" in (tmp_path / "kl_gradients.csv").read_text()
  with pytest.raises(ValueError, match="lams"):
    analysis.lambda_spectrum((scfg, sp), (tcfg, tp), [batch], lams=(2.5,),
                             rng=jax.random.key(0), max_new_tokens=3)


@pytest.mark.slow
def test_spectrum_rollouts_sample_only_the_real_vocabulary(monkeypatch):
  cfg = dataclasses.replace(models.ModelConfig(), family="llama", vocab_size=64,
                            hidden_size=16, intermediate_size=32,
                            num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=8,
                            eos_token_id=(2,), max_position_embeddings=64,
                            dtype="float32", param_dtype="float32")
  sp, tp = models.init(cfg, jax.random.key(0)), models.init(cfg, jax.random.key(1))
  seen = []
  real_generate = rollout.generate
  def spy(*a, **k):
    r = real_generate(*a, **k)
    seen.append(np.asarray(r.tokens)[np.asarray(r.loss_mask) > 0])
    return r
  monkeypatch.setattr(rollout, "generate", spy)
  batch = {"prompt": np.full((2, 3), 3, np.int32),
           "prompt_mask": np.ones((2, 3), np.int32)}
  analysis.lambda_spectrum((cfg, sp), (cfg, tp), [batch], lams=(0.5,),
                           rng=jax.random.key(0), max_new_tokens=8,
                           eos_token_ids=(2,), vocab_size=6)
  toks = np.concatenate(seen)
  assert toks.size and toks.max() < 6  # 58 of 64 ids are padding columns


def test_figure_spans_full_ranges_and_names_random_models(tmp_path, monkeypatch):
  """Numbers that differ in the 4th decimal must not fill the plot as a trend."""
  import matplotlib.figure
  figs = []
  save = matplotlib.figure.Figure.savefig
  monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                      lambda self, *a, **k: (figs.append(self), save(self, *a, **k))[1])
  rows = [dict(lam=l, student_fraction=l, tokens=10.0, fkl=0.5, rkl=0.5,
               fkl_norm=0.3 + 1e-4 * l, rkl_norm=0.3, cos=0.9 - 1e-4 * l,
               fkl_under=0.5 + 1e-4 * l, fkl_over=0.5 - 1e-4 * l,
               rkl_under=0.5, rkl_over=0.5) for l in (0.0, 0.5, 1.0)]
  paths = analysis.write_spectrum(rows, str(tmp_path), note=analysis.PLUMBING_NOTE)
  norm_ax, cos_ax, share_ax = figs[-1].axes
  assert norm_ax.get_ylim()[0] <= 0.0 and norm_ax.get_ylim()[1] >= 0.3
  assert cos_ax.get_ylim()[0] <= -1.0 and cos_ax.get_ylim()[1] >= 1.0
  assert share_ax.get_ylim()[0] <= 0.0 and share_ax.get_ylim()[1] >= 1.0
  assert "plumbing check" in figs[-1]._suptitle.get_text()  # pylint: disable=protected-access
  assert "plumbing check" in open(paths[1]).read().splitlines()[0]


def test_run_places_the_models_by_the_configs_rules(monkeypatch):
  """config.rules, not sharding.DEFAULT_RULES, shard the models run() loads."""
  c = distill.get_config("runlocal")
  c.mesh = dict(data=1, fsdp=2, tensor=1)
  # As a config read back from JSON holds them: lists. Default: P(None, 'fsdp').
  c.rules = [["batch", ["data", "fsdp"]], ["vocab", "fsdp"], ["embed", None]]
  seen = []
  monkeypatch.setattr(analysis, "lambda_spectrum",
                      lambda s, t, *a, **k: seen.extend((s, t)) or [])
  analysis.run(c, [0.0], devices=jax.devices()[:2])
  specs = [p["embed_tokens"]["embedding"].sharding.spec for _, p in seen]
  assert specs == [P("fsdp", None)] * 2  # student, teacher: [V, D]
