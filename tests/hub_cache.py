"""A pre-seeded Hugging Face hub cache, built locally (no network).

  info = build('/tmp/hf_hub')        # then HF_HUB_CACHE=/tmp/hf_hub HF_HUB_OFFLINE=1
  PYTHONPATH=. python -m tests.hub_cache /tmp/hf_hub     # the same, from a shell

Laid out as huggingface_hub's cache: <repo folder>/blobs/<sha256>,
refs/<branch> (the commit) and snapshots/<commit>/<file> (a relative
symlink to its blob), for model and dataset repos. It holds

- tiny random Llama 3 and Qwen2.5 checkpoints (runlocal-sized: vocabulary
  320, width 32-64, 2 layers) named like the study's (CHECKPOINTS), each with
  the shared byte-level BPE tokenizer and its chat template, config.json and
  generation_config.json; Qwen/Qwen2.5-0.5B-Instruct has a second snapshot
  (other weights) on the branch `v1`;
- a few rows of SciQ, MedMCQA and GPQA in their hub files' real layouts
  (allenai/sciq: data/{split}-00000-of-00001.parquet; openlifescienceai/medmcqa:
  the same, cop 0-based, -1 on the unlabelled test split; Idavidrein/gpqa:
  gpqa_diamond.csv and gpqa_main.csv with the CSV's column names);
- the paper's science and medical sets in their repos' layouts and row
  schemas, generated (sciknoweval_files / medreason_files): hicai-zju/
  SciKnowEval (data/{Chemistry,Biology}/sciknoweval_*_test.jsonl at the
  commit the project pins it to, PINNED; rows with
  question, choices {text, label}, answerKey, type, domain, details.level)
  and UCSC-VLAA/MedReason (ours_quality_33000.jsonl, rows with question,
  options as one "A. ..." text, answer as the option's text, reasoning),
  SEEDED_POOL questions each (fewer than the paper's draws: the train splits
  come out short), with rows outside the pool mixed in.

Commits are deterministic 40-hex digests of the files (`info` lists them).
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import os
import sys
import tempfile

from huggingface_hub import constants as hf_constants
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import safetensors.numpy

from jaxdistill import models
from jaxdistill.data import tokenizer as tok_lib

# repo -> (preset whose family, RoPE and tying it copies, width, layers)
CHECKPOINTS = {
    "meta-llama/Llama-3.2-1B-Instruct": ("llama-3.2-1b", 32, 2),
    "meta-llama/Llama-3.1-8B-Instruct": ("llama-3.1-8b", 64, 2),
    "Qwen/Qwen2.5-0.5B-Instruct": ("qwen2.5-0.5b", 32, 2),
    "Qwen/Qwen2.5-1.5B-Instruct": ("qwen2.5-1.5b", 48, 2),
    "Qwen/Qwen2.5-7B-Instruct": ("qwen2.5-7b", 64, 2),
}
REVISED = "Qwen/Qwen2.5-0.5B-Instruct"  # also on branch `v1`, other weights
VOCAB = 320

SCIQ = [  # question, distractor3, distractor1, distractor2, correct_answer
    ("What gas do plants absorb from the air for photosynthesis?", "helium",
     "oxygen", "nitrogen", "carbon dioxide"),
    ("Which organelle is the site of cellular respiration?", "ribosome",
     "nucleus", "vacuole", "mitochondrion"),
    ("What is the SI unit of force?", "joule", "watt", "pascal", "newton"),
    ("Which particle carries a negative charge?", "neutron", "proton",
     "photon", "electron"),
    ("What type of bond shares electron pairs between atoms?", "ionic",
     "metallic", "hydrogen", "covalent"),
    ("Which planet is closest to the sun?", "venus", "earth", "mars",
     "mercury"),
    ("What is the chemical symbol of sodium?", "so", "s", "sd", "na"),
    ("Which layer of the atmosphere holds the ozone layer?", "troposphere",
     "mesosphere", "thermosphere", "stratosphere"),
    ("What do we call animals that eat only plants?", "carnivores",
     "omnivores", "decomposers", "herbivores"),
    ("What is the pH of pure water at 25 C?", "5", "9", "14", "7"),
    ("Which blood cells fight infection?", "red blood cells", "platelets",
     "plasma cells", "white blood cells"),
    ("What force keeps planets in orbit around the sun?", "friction",
     "magnetism", "tension", "gravity"),
]
SCIQ_SPLITS = {"train": SCIQ[:6], "validation": SCIQ[6:9], "test": SCIQ[9:]}

MEDMCQA = [  # question, opa, opb, opc, opd, cop (0-based), subject
    ("Which nerve supplies the deltoid muscle?", "Radial", "Axillary",
     "Musculocutaneous", "Ulnar", 1, "Anatomy"),
    ("Deficiency of which vitamin causes scurvy?", "Vitamin A", "Vitamin D",
     "Vitamin C", "Vitamin K", 2, "Biochemistry"),
    ("The normal adult resting heart rate is", "60-100 per minute",
     "30-50 per minute", "110-150 per minute", "150-200 per minute", 0,
     "Physiology"),
    ("Drug of choice for anaphylactic shock is", "Atropine", "Dopamine",
     "Hydrocortisone", "Adrenaline", 3, "Pharmacology"),
    ("Koplik spots are seen in", "Measles", "Mumps", "Rubella", "Chickenpox",
     0, "Pediatrics"),
    ("Insulin is secreted by which cells of the pancreas?", "Alpha cells",
     "Beta cells", "Delta cells", "Acinar cells", 1, "Physiology"),
    ("The largest bone of the human body is", "Tibia", "Humerus", "Femur",
     "Fibula", 2, "Anatomy"),
    ("Which antibody crosses the placenta?", "IgA", "IgM", "IgE", "IgG", 3,
     "Microbiology"),
    ("Which enzyme is raised first after a myocardial infarction?",
     "Troponin", "LDH", "ALP", "Amylase", 0, "Biochemistry"),
    ("Carpal tunnel syndrome compresses which nerve?", "Ulnar", "Median",
     "Radial", "Axillary", -1, "Anatomy"),
    ("Which vitamin is synthesised in the skin?", "Vitamin B12", "Vitamin C",
     "Vitamin D", "Vitamin E", -1, "Biochemistry"),
]
MEDMCQA_SPLITS = {"train": MEDMCQA[:6], "validation": MEDMCQA[6:9],
                  "test": MEDMCQA[9:]}

GPQA = [  # Question, Correct Answer, Incorrect Answer 1..3
    ("What is the ground-state term symbol of atomic carbon?", "3P0", "1S0",
     "3P2", "1D2"),
    ("Which quantity is conserved in an elastic collision but not in an "
     "inelastic one?", "kinetic energy", "momentum", "mass", "charge"),
    ("How many chiral centres does glucose have in its open-chain form?", "4",
     "3", "5", "6"),
    ("Which codon is a start codon in the standard genetic code?", "AUG",
     "UAA", "UGA", "UAG"),
]
GPQA_COLUMNS = ("Pre-Revision Question", "Pre-Revision Correct Answer",
                "Pre-Revision Incorrect Answer 1",
                "Pre-Revision Incorrect Answer 2",
                "Pre-Revision Incorrect Answer 3", "Question", "Correct Answer",
                "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3",
                "Explanation", "Subdomain", "Record ID", "High-level domain")


def _commit(repo_id: str, files: dict[str, bytes]) -> str:
  h = hashlib.sha1(repo_id.encode())
  for name in sorted(files):
    h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
  return h.hexdigest()


def add_repo(cache: str, repo_id: str, files: dict[str, bytes], *,
             repo_type: str = "model", refs=("main",),
             commit: str | None = None) -> str:
  """Writes one snapshot of a repo into the cache (at `commit`, default a
  digest of its files); points `refs` at it."""
  root = os.path.join(cache, f"{repo_type}s--" + repo_id.replace("/", "--"))
  commit = commit or _commit(repo_id, files)
  for name, data in files.items():
    blob = os.path.join(root, "blobs", hashlib.sha256(data).hexdigest())
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    with open(blob, "wb") as f:
      f.write(data)
    link = os.path.join(root, "snapshots", commit, name)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if not os.path.lexists(link):
      os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
  os.makedirs(os.path.join(root, "refs"), exist_ok=True)
  for ref in refs:
    with open(os.path.join(root, "refs", ref), "w") as f:
      f.write(commit)  # huggingface_hub writes it without a newline
  return commit


def _dir_files(d: str) -> dict[str, bytes]:
  out = {}
  for name in sorted(os.listdir(d)):
    with open(os.path.join(d, name), "rb") as f:
      out[name] = f.read()
  return out


def _model_files(preset: str, width: int, layers: int, seed: int,
                 tok_files: dict[str, bytes]) -> dict[str, bytes]:
  """config.json, model.safetensors (numpy-random, in Hugging Face names and
  layouts), generation_config.json and the tokenizer."""
  base = models.get_preset(preset)
  heads = max(2, width // 16)
  cfg = dataclasses.replace(
      base, vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width,
      num_hidden_layers=layers, num_attention_heads=heads,
      num_key_value_heads=max(1, heads // 2), head_dim=16, bos_token_id=1,
      eos_token_id=(2,), max_position_embeddings=4096, dtype="float32",
      param_dtype="float32")
  d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
  shapes = {"model.embed_tokens.weight": (VOCAB, d), "model.norm.weight": (d,)}
  if not cfg.tie_word_embeddings:
    shapes["lm_head.weight"] = (VOCAB, d)
  for i in range(layers):  # Hugging Face names and [out, in] layouts
    p = f"model.layers.{i}."
    shapes.update({
        p + "input_layernorm.weight": (d,),
        p + "post_attention_layernorm.weight": (d,),
        p + "self_attn.q_proj.weight": (q, d),
        p + "self_attn.k_proj.weight": (kv, d),
        p + "self_attn.v_proj.weight": (kv, d),
        p + "self_attn.o_proj.weight": (d, q),
        p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
        p + "mlp.down_proj.weight": (d, f)})
    if cfg.attention_bias:
      shapes.update({p + "self_attn.q_proj.bias": (q,),
                     p + "self_attn.k_proj.bias": (kv,),
                     p + "self_attn.v_proj.bias": (kv,)})
  rng = np.random.default_rng(seed)
  tensors = {k: (rng.normal(0.0, 0.2, s) + ("norm" in k)).astype(np.float32)
             for k, s in shapes.items()}
  files = {"model.safetensors": safetensors.numpy.save(
               tensors, metadata={"format": "pt"}),
           "config.json": json.dumps(models.config_to_hf(cfg), indent=2).encode()}
  files["generation_config.json"] = json.dumps(
      {"bos_token_id": 1, "eos_token_id": [2], "do_sample": True}).encode()
  files.update(tok_files)
  return files


def _parquet(rows: list[dict]) -> bytes:
  buf = io.BytesIO()
  pq.write_table(pa.Table.from_pylist(rows), buf)
  return buf.getvalue()


def sciq_rows(split: str) -> list[dict]:
  return [{"question": q, "distractor3": d3, "distractor1": d1,
           "distractor2": d2, "correct_answer": a,
           "support": f"Textbook passage about {a}."}
          for q, d3, d1, d2, a in SCIQ_SPLITS[split]]


def medmcqa_rows(split: str) -> list[dict]:
  return [{"id": hashlib.md5(q.encode()).hexdigest()[:8] + "-medmcqa",
           "question": q, "opa": a, "opb": b, "opc": c, "opd": d, "cop": cop,
           "choice_type": "single", "exp": None if cop < 0 else "Explained.",
           "subject_name": subject, "topic_name": None}
          for q, a, b, c, d, cop, subject in MEDMCQA_SPLITS[split]]


def jsonl(rows) -> bytes:
  return "".join(json.dumps(r) + "\n" for r in rows).encode()


# Repos seeded at the commit the project pins them to (a default --revision).
PINNED = {"hicai-zju/SciKnowEval": "3284f6fbf3b8063ab8a0408a65fb00157dbdc9fa"}
SEEDED_POOL = 520  # the seeded paper sets' pools: the test split, then 13 / 20


def sciknoweval_row(i, domain="Chemistry", level="L3", kind="mcq-4-choices",
                    labels="ABCD", n_texts=4) -> dict:
  """A SciKnowEval row; its answer is letter i % 4."""
  return {"question": f"Chemistry question {i}: which reagent?",
          "choices": {"text": [f"reagent {i}-{k}" for k in range(n_texts)],
                      "label": list(labels)},
          "answerKey": "ABCD"[i % 4], "type": kind, "domain": domain,
          "details": {"level": level, "task": "reaction", "subtask": "x"},
          "answer": "", "prompt": {"default": "Answer the question."}}


def sciknoweval_files(n: int) -> dict[str, bytes]:
  """n pool questions (0..n-1) and, outside the pool, a repeat of question 7
  (other case and spacing), 3 broken rows, 2 of other types, 2 of other
  levels and 20 of Biology."""
  chem = [sciknoweval_row(i) for i in range(n)]
  dup = dict(sciknoweval_row(7),
             question="  CHEMISTRY question 7:  which reagent?")
  chem += [dup, sciknoweval_row(9000, labels="ABCE"),
           sciknoweval_row(9001, n_texts=5),
           dict(sciknoweval_row(9002), answerKey="E"),
           sciknoweval_row(9003, kind="open-ended-qa"),
           sciknoweval_row(9004, kind="true_or_false"),
           sciknoweval_row(9005, level="L2"), sciknoweval_row(9006, level="L1")]
  bio = [sciknoweval_row(10_000 + i, domain="Biology") for i in range(20)]
  return {"data/Chemistry/sciknoweval_chemistry_test.jsonl": jsonl(chem),
          "data/Biology/sciknoweval_biology_test.jsonl": jsonl(bio),
          "README.md": b"---\nlicense: mit\n---\n"}


def medreason_options(i) -> list[str]:
  return [f"finding {i}-{k}" for k in range(4 + i % 2)]  # 4 or 5 options


def medreason_row(i) -> dict:
  """A MedReason row; its answer is option i % (number of options), its text
  (a third of them upper-cased and followed by an explanation)."""
  opts = medreason_options(i)
  answer = opts[i % len(opts)]
  if i % 3 == 1:
    answer = answer.upper() + ". Explanation: it is the classic sign."
  return {"dataset_name": "medqa" if i % 2 else "medmcqa",
          "id_in_dataset": i, "question": f"Patient {i}: the likely finding?",
          "options": "Answer Choices:\n" + "\n".join(
              f"{'ABCDE'[k]}. {o}" for k, o in enumerate(opts)),
          "answer": answer, "reasoning": "Finding reasoning path ..."}


def medreason_files(n: int) -> dict[str, bytes]:
  """n pool questions (0..n-1) and, outside the pool, an open-ended row, a
  row whose answer is no option and a repeat of question 2."""
  rows = [medreason_row(i) for i in range(n)]
  rows += [{"dataset_name": "huatuo", "id_in_dataset": 1, "question": "Why?",
            "options": None, "answer": "Because.", "reasoning": "..."},
           dict(medreason_row(1), answer="something else entirely"),
           dict(medreason_row(2), question="patient 2:  the likely finding?")]
  return {"ours_quality_33000.jsonl": jsonl(rows),
          "README.md": b"---\nlicense: apache-2.0\n---\n"}


def _gpqa_csv(rows) -> bytes:
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(GPQA_COLUMNS)
  for i, (q, a, w1, w2, w3) in enumerate(rows):
    w.writerow([q, a, w1, w2, w3, q, a, w1, w2, w3, "Because.", "Physics",
                f"rec{i:04d}", "Physics"])
  return buf.getvalue().encode()


def _data_files() -> dict[str, dict[str, bytes]]:
  sciq = {f"data/{s}-00000-of-00001.parquet": _parquet(sciq_rows(s))
          for s in SCIQ_SPLITS}
  med = {f"data/{s}-00000-of-00001.parquet": _parquet(medmcqa_rows(s))
         for s in MEDMCQA_SPLITS}
  gpqa = {"gpqa_diamond.csv": _gpqa_csv(GPQA[:3]),
          "gpqa_main.csv": _gpqa_csv(GPQA)}
  card = b"---\nlicense: cc-by-4.0\n---\n"
  return {"allenai/sciq": {**sciq, "README.md": card},
          "openlifescienceai/medmcqa": {**med, "README.md": card},
          "Idavidrein/gpqa": {**gpqa, "README.md": card},
          "hicai-zju/SciKnowEval": sciknoweval_files(SEEDED_POOL),
          "UCSC-VLAA/MedReason": medreason_files(SEEDED_POOL)}


def use(monkeypatch, cache: str, *, offline: bool = True) -> None:
  """Points huggingface_hub at `cache`: its constants (read once, at import)
  in this process, the environment for subprocesses."""
  monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", cache)
  monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", offline)
  monkeypatch.setenv("HF_HUB_CACHE", cache)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")


def build(cache: str) -> dict:
  """Seeds `cache`; returns {'models': {repo: commit}, 'revised': commit of
  REVISED on branch v1, 'datasets': {repo: commit}, 'tokenizer': dir}."""
  os.makedirs(cache, exist_ok=True)
  texts = tok_lib.countdown_texts((3, 4), 30) + [
      f"{q} {' '.join(o)}" for q, *o in SCIQ + GPQA]
  with tempfile.TemporaryDirectory() as d:
    tok_lib.train_bpe_tokenizer(texts, 300, d)
    tok_files = _dir_files(d)
  info = {"models": {}, "datasets": {}}
  for i, (repo, (preset, width, layers)) in enumerate(CHECKPOINTS.items()):
    info["models"][repo] = add_repo(
        cache, repo, _model_files(preset, width, layers, i, tok_files))
  info["revised"] = add_repo(
      cache, REVISED, _model_files(CHECKPOINTS[REVISED][0],
                                   CHECKPOINTS[REVISED][1], 2, 99, tok_files),
      refs=("v1",))
  for repo, files in _data_files().items():
    info["datasets"][repo] = add_repo(cache, repo, files, repo_type="dataset",
                                      commit=PINNED.get(repo))
  return info


if __name__ == "__main__":
  print(json.dumps(build(sys.argv[1]), indent=2))
