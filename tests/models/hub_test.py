"""Checkpoints by hub name (jaxdistill.models.hub) through huggingface_hub's
real cache lookup, offline, against a seeded cache (tests/hub_cache.py).

References: the commits come from the seeded cache's refs (written by the
test helper), the weights from safetensors.numpy reading the snapshot's file,
and the errors huggingface_hub raises are its own (a gated repo's by making
its `repo_info` call raise GatedRepoError, as the hub answers 403)."""
import json
import os
import shutil

import httpx2
import huggingface_hub
from huggingface_hub import errors as hf_errors
from huggingface_hub import HfApi
from huggingface_hub.utils import are_progress_bars_disabled
import ml_collections
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxdistill import models
from jaxdistill.models import hub
from jaxdistill.train import setup as train_setup
from tests import hub_cache

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


def _snapshot(cache, repo, commit, kind="models"):
  return os.path.join(cache, f"{kind}--{repo.replace('/', '--')}", "snapshots",
                      commit)


def test_a_name_a_branch_and_a_commit_resolve_to_their_snapshots(
    hf_cache, seeded_hub):
  cache = seeded_hub[0]
  main, v1 = hf_cache["models"][QWEN], hf_cache["revised"]
  for spec, commit, rev in ((QWEN, main, "main"), (f"{QWEN}@v1", v1, "v1"),
                            (f"{QWEN}@{v1}", v1, v1)):
    local, info = hub.resolve(spec)
    assert os.path.realpath(local) == os.path.realpath(_snapshot(cache, QWEN, commit))
    assert info == {"id": QWEN, "revision": rev, "commit": commit}
  assert hub.pin(f"{QWEN}@v1") == f"{QWEN}@{v1}"
  # load_pretrained by name reads the snapshot's tensors (HF [out, in] layout).
  cfg, params = models.load_pretrained(f"{QWEN}@v1")
  ref = load_file(os.path.join(_snapshot(cache, QWEN, v1), "model.safetensors"))
  np.testing.assert_array_equal(np.asarray(params["embed_tokens"]["embedding"]),
                                ref["model.embed_tokens.weight"])
  assert cfg.family == "qwen2" and cfg.vocab_size == hub_cache.VOCAB


def test_offline_misses_are_one_line_errors_naming_the_id(hf_cache, seeded_hub):
  with pytest.raises(hub.HubError) as e:
    hub.resolve("Qwen/Qwen2.5-72B-Instruct")
  msg = str(e.value)
  assert "Qwen/Qwen2.5-72B-Instruct is not in the local Hugging Face cache" in msg
  assert "HF_HUB_OFFLINE=1" in msg and "\n" not in msg
  with pytest.raises(hub.HubError, match=r"revision 'v9' is not in the local "
                     r".*HF_HUB_OFFLINE=1; cached: main, v1"):
    hub.resolve(f"{QWEN}@v9")
  # The same through a config field and the command's one-line error.
  mcfg = ml_collections.ConfigDict(dict(path="Qwen/Qwen2.5-72B-Instruct",
                                        preset=None, init=None))
  with pytest.raises(ValueError, match=r"^config.teacher.path: Qwen/Qwen2.5-72B"):
    train_setup.model_config(mcfg, "teacher")


def _gated(self, repo_id, **kw):
  del self, kw
  url = f"https://huggingface.co/api/models/{repo_id}"
  raise hf_errors.GatedRepoError(
      f"403 Client Error. Cannot access gated repo for url {url}.",
      response=httpx2.Response(403, request=httpx2.Request("GET", url)))


def test_a_gated_repo_without_access_names_its_licence_page(
    seeded_hub, monkeypatch):
  # Online, the hub answers 403 for a gated repo the token may not read;
  # huggingface_hub then looks in the cache and, not finding it, re-raises.
  hub_cache.use(monkeypatch, seeded_hub[0], offline=False)
  monkeypatch.setattr(HfApi, "repo_info", _gated)
  monkeypatch.delenv("HF_TOKEN", raising=False)
  for call in (hub.resolve, hub.pin):
    with pytest.raises(hub.HubError) as e:
      call("meta-llama/Llama-3.3-70B-Instruct")
    assert str(e.value) == (
        "meta-llama/Llama-3.3-70B-Instruct is gated: accept its licence at "
        "https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct and set "
        "HF_TOKEN to a token of the account that accepted it")
  # A gated repo already in the cache is used (huggingface_hub's fallback).
  llama = "meta-llama/Llama-3.2-1B-Instruct"
  assert hub.resolve(llama)[1]["commit"] == seeded_hub[1]["models"][llama]


def test_a_directory_wins_over_a_hub_name_of_the_same_spelling(
    hf_cache, tmp_path, monkeypatch):
  other = hub.resolve("Qwen/Qwen2.5-1.5B-Instruct")[0]
  monkeypatch.chdir(tmp_path)
  shutil.copytree(other, tmp_path / QWEN)  # ./Qwen/Qwen2.5-0.5B-Instruct
  local, info = hub.resolve(QWEN)
  assert info is None and local == QWEN
  assert not hub.is_hub_id(QWEN)
  assert models.checkpoint.read_config(local).hidden_size == 48  # the 1.5B's


def test_preset_or_init_wins_over_path_and_never_touches_the_hub(hf_cache):
  mcfg = ml_collections.ConfigDict(dict(
      path="nobody/not-cached", preset="qwen2.5-0.5b", init=None,
      dtype="float32", param_dtype="float32", overrides={}))
  assert hub.weights_spec(mcfg) is None
  cfg = train_setup.model_config(mcfg, "student")
  assert cfg.hidden_size == models.get_preset("qwen2.5-0.5b").hidden_size
  mcfg.preset, mcfg.init = None, dict(hidden_size=32)
  assert train_setup.model_config(mcfg, "student").hidden_size == 32
  mcfg.init = None  # now the path is read: offline, not cached
  with pytest.raises(ValueError, match="nobody/not-cached is not in the local"):
    train_setup.model_config(mcfg, "student")


def test_a_training_workdir_is_refused_naming_its_export(hf_cache, tmp_path):
  """Issue 31 item 12: it used to say "unsupported model_type None"."""
  work = tmp_path / "run"
  work.mkdir()
  (work / "config.json").write_text(json.dumps({"student": {}, "loss": {}}))
  mcfg = ml_collections.ConfigDict(dict(path=str(work), preset=None, init=None,
                                        dtype="float32", param_dtype="float32",
                                        overrides={}))
  with pytest.raises(FileNotFoundError, match=r"config.student.path: .*run is a "
                     r"training workdir with no hf_student/ export yet"):
    train_setup.model_config(mcfg, "student")
  shutil.copytree(hub.resolve(QWEN)[0], work / "hf_student")
  with pytest.raises(ValueError) as e:
    train_setup.model_config(mcfg, "student")
  assert str(e.value) == (f"config.student.path: {work} is a training workdir, "
                          f"not a checkpoint: use its exported student, "
                          f"{work / 'hf_student'}")
  # Where a command takes a workdir (evaluate, rl.train), it is its export.
  assert hub.checkpoint_dir(str(work), "--checkpoint", workdir_ok=True) == str(
      work / "hf_student")


@pytest.mark.parametrize("process,shown", [(0, True), (1, False)])
def test_only_process_0_shows_download_progress(hf_cache, monkeypatch, process,
                                                shown):
  seen = []
  real = huggingface_hub.snapshot_download

  def spy(*a, **kw):  # the real download, noting whether bars are shown
    seen.append(not are_progress_bars_disabled())
    return real(*a, **kw)
  monkeypatch.setattr(huggingface_hub, "snapshot_download", spy)
  monkeypatch.setattr(hub.jax, "process_index", lambda: process)
  assert hub.resolve(QWEN)[1]["commit"] == hf_cache["models"][QWEN]
  assert seen == [shown] and not are_progress_bars_disabled()
