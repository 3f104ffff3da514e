r"""The whole study in miniature on a CPU: the settings of `python -m jaxdistill.demo`.

  python -m jaxdistill.demo                 # this config
  python -m jaxdistill.demo --quick         # get_config('quick'): the tests' run
  python -m jaxdistill.demo --spectrum      # the paper's lambda in {-2, -1, 0, 1, 2} x KL
  python -m jaxdistill.demo --seeds 3       # the grid over 3 seeds
  python -m jaxdistill.demo --rlvr          # then GRPO from the best arm of
                                            # each KL x rollout policy
  python -m jaxdistill.demo --workers 1     # arms one after another (default:
                                            # side by side, one per CPU core)
  python -m jaxdistill.demo --config configs/demo.py:arm_steps=100,lrs=2e-4+2e-3

A Llama 3 teacher and a smaller student are trained from scratch: the teacher
on step-by-step arithmetic chains of 3 to 6 numbers ("Compute 7+8+4-9"), the
student on the 3-number ones, 30 % of the 4-number ones and its second task, the
single-digit addition facts asked as even/odd multiple choice (its
out-of-distribution suite for forgetting). Then the grid KL direction x
rollout policy (student, teacher) x learning rate distils the
teacher into the student on 4-number prompts, each arm with the real training
loop, and every arm is evaluated on 4-number chains (in distribution),
6-number chains (harder) and addition. With --rlvr, GRPO (the study's RLVR
stage) then runs on the 4-number prompts from the best arm (in-distribution
greedy accuracy, over learning rates) of each KL direction x rollout policy,
and those are evaluated again: does the on-policy gain survive RLVR? The
page docs/demo.md gives the measured times and results.

The learning rates, 5e-7 and 2e-4 (the study: 1e-5 and 5e-5). The low rate
is the study's low-rate regime in what it does to the weights: most of them
unchanged in bfloat16 and the second task intact; the high rate teaches.
Measured with the former teacher schedule's 97 % teacher ("The teacher"
below) and a student at 14.5 %, forward KL, student rollouts, 320 steps of
16 rollouts, seed 0 (forgetting: drop of addition accuracy from 100 %; the
60 % and 63 % teachers gave the same regimes at 5e-7 and 2e-4, see
docs/demo.md):

  lr     4-number  forgetting  bf16 sparsity after 40 / 320 steps
  2e-3   64.5 %    +100 pp       - / 0.3 %   (the previous grid's high rate)
  5e-4   66.5 %    +88 pp        - / 0.9 %   (the previous grid's low rate)
  2e-4   43.5 %    +49 pp      4.7 / 1.5 %
  1e-4   32.0 %    +9 pp       8.0 / 2.2 %   (1/30 of the student's own rate)
  2e-5   15.0 %    0          23.4 / 6.3 %
  5e-6   15.5 %    0          53.1 / 16.1 %
  5e-7   13.0 %    0          92.3 / 61.4 %

A weight reads unchanged in bfloat16 until its total change approaches the
spacing of bfloat16 numbers near it, |w| x 2^-8 to 2^-7: 1.2e-4 for the
median weight here (|w| 0.025, as in the study's models, 0.02-0.05). Adam
moves every weight by about lr per step, on this narrow task in a steady
direction, so what counts is lr x steps: sparsity at equal lr x steps is
equal (2e-5 x 80 steps and 5e-6 x 320 steps: 16 %), and more steps at any
rate only lower it. Half the weights stay unchanged up to lr x steps of about
2e-4 (5e-7 x 320 steps moves the median weight by 4e-5), while accuracy
moves only once the weights move by several % (1e-4 x 320 steps: 2e-3, 8 %
of the median weight, and 14.5 -> 32 %). So in a student this small no
single rate is both sparse and teaching, as the study's students are (they
learn while 85-90 % of their weights stay unchanged in bfloat16), and the
grid spans the two regimes: 5e-7 leaves 61-66 % of the weights and the
addition task untouched and teaches nothing; 2e-4 is the lowest rate tried
whose best arm closes a third of the teacher-student gap. Rates that are the
study's fraction of the student's own rate (1e-4, 5e-4) change nearly every
weight. The weights' scale is not what differs (it is the study's), nor a
setting of the models (normal(0.02) init, as Llama's). `--spectrum` keeps
lr 5e-4, where accuracy moves most.

Fewer steps per arm would save time, but at a higher rate to teach as much:
200 steps (forward KL, student rollouts, the 63 % teacher below) gave
4-number accuracy 26.0 / 30.5 / 36.0 % and forgetting +24.0 / +36.5 /
+59.4 pp at 2e-4 / 3e-4 / 4e-4, so the grid keeps 320 steps at 2e-4 and
its arms run side by side instead (`--workers`, one per CPU core).

The teacher. Its former schedule (lr 3e-3, 5 % warm-up, 900 steps) was
chaotic: two builds whose floats differed only in rounding gave teachers at
97.0 % and 60.0 % (their losses agree for 50 steps, part at a gradient spike
at step 60 just after the warm-up, and end at 0.019 and 0.058). The schedule
here (lr 2e-3, 10 % warm-up, 600 steps) gives the same teacher from seed to
seed: 63.0 % and 62.5 % on 4-number chains (6-number: 24.5 / 21.5 %),
final loss 0.061 / 0.060, for seeds 0 and 1; and it trains in two thirds of
the time. A teacher near 100 % would need a lower loss than 600 steps reach;
the gap to the student (11 %) is what the grid needs.

That teacher was measured on an earlier host. The same code trains another
teacher on another 2-core host (AMD EPYC, 2026-12-02): 100.0 % on 4-number
and 90.5 % on 6-number chains, final loss 0.0087, its loss bitwise the same
under the code before and after the paper's method (a CE run has no
teacher, temperature or per-completion mean), so the host's float rounding,
not the code, makes the teacher. Its student: 9.0 %.

The paper's method against the former one, on that host, both models
identical, seed 0 (`python -m jaxdistill.demo --workdir DIR` at commits
bc13d01 and 9960881; greedy % on 4-number chains, forgetting in pp; the
sparsity columns are each code's own figure: the former |delta| <= 1e-5 in
bfloat16, the paper's S_1e-6 in float32):

  arm at lr 2e-4           former method         the paper's method
                           acc  forget  bf16     acc  forget  S_1e-6
  forward, student         60.5  +38.5  1.5      64.0  +26.0   0.0
  forward, teacher         60.0  +36.5  1.5      60.5  +51.0   0.0
  reverse, student         34.5  +88.5  1.6      52.5  +29.2   0.0
  reverse, teacher         51.5  +86.5  1.6      59.0  +53.1   0.0
  the four at 5e-7     9.5-11.0   0.0  57-59  9.5-11.0   0.0  0.9-1.1
                                               (bf16 1e-5: 54-59)

Both reproduce the same 3 of the 6 findings they test (no on-policy edge;
forgetting and sparsity governed by the rate) and miss the same three
(reverse KL more setting-sensitive, reverse KL preferring student rollouts,
an on-policy gain on 6-number chains). The method moved reverse KL most:
at 2e-4 it learns more and forgets less (the teacher's target at
temperature 0.5 is sharper, and each completion weighs the same; these runs
do not separate the two). The earlier host's run
of the former method reproduced 4 (reverse KL was the more setting-
sensitive there, 34.8 vs 21.8 pp) with its 63 % teacher: what moved that
verdict is the teacher, not the method. In float32 at strict 1e-6, 320 Adam
steps move nearly every weight even at 5e-7 (S_1e-6 about 1 %): the
paper's 85-90 % is not reachable with float32 master weights here.

Weight precision (grid.precisions; forward KL, student rollouts, 320 steps,
seed 0, the models above; `--config configs/demo.py:precisions=float32+
bfloat16,kl=forward,policies=student,lrs=5e-7+5e-6+2e-5+1e-4+2e-4`):

  lr     float32: 4-number forget S_1e-6   bfloat16: 4-number forget S_1e-6
  5e-7            11.0     +0.0     1.1             9.0      +0.0    99.7
  5e-6            11.0     +0.0     0.2            10.5      +0.0    96.2
  2e-5            19.5     +0.0     0.1             9.0      +0.0    84.9
  1e-4            29.5     +2.1     0.0            24.5      +1.0    46.5
  2e-4            64.0    +26.0     0.0            30.5     +26.0    17.3

Stored in bf16 (no float32 copy), updates below half a bf16 step are
rounded away: sparsity falls smoothly with the rate, and at 1e-4 the student
learns a little (a sixth of the gap) at 1 pp of forgetting with 46.5 % of
its weights bit-equal, the nearest to the paper's low-rate regime so far,
short of it on every count. The default stays float32 (docs/demo.md).

Rates x precision x steps (2026-12-04, a host whose default models are a
100.0 % teacher and a 20.5 % student, so a third of the gap is 47.0 %;
forward KL, student rollouts, seed 0; `--config configs/demo.py:precisions=
P,kl=forward,policies=student,lrs=L,arm_steps=N`):

  lr    steps   float32: 4-number forget S_1e-6   bfloat16: 4-number forget S_1e-6
  1e-4  160              31.0     +0.0    0.0              27.5     +0.0   47.6
  1e-4  320              35.5     +0.0    0.0              31.0     +4.2   45.4
  1e-4  640                -        -      -               36.5    +13.5   44.1
  2e-4  160              33.5     +5.2    0.0              33.5    +10.4   17.7
  2e-4  320              42.0    +12.5    0.0              35.0    +39.6   16.2
  2e-4  640                -        -      -               61.5    +78.1   14.4
  5e-4  640                -        -      -               92.0    +97.9    1.0

No setting teaches a third of the gap, forgets <= 10 pp and keeps S_1e-6 >=
50 % at once. In bfloat16 the rate, not the steps, sets the sparsity (at
1e-4: 47.6 / 45.4 / 44.1 % over 160 / 320 / 640 steps): weights too large for
the rate never move, while accuracy and forgetting grow with the steps.
"""
import ml_collections

from jaxdistill import config_lib

TEACHER = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=32)
STUDENT = dict(hidden_size=96, intermediate_size=288, num_hidden_layers=3,
               num_attention_heads=3, num_key_value_heads=1, head_dim=32)
# The paper's spectrum pi_lambda (rollout/spectrum.py): -1 the teacher, +1 the
# student, beyond them the clipped extrapolations.
SPECTRUM = (("lam-2", -2.0), ("teacher", -1.0), ("lam0", 0.0),
            ("student", 1.0), ("lam2", 2.0))


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, quick=False, spectrum=False, seed=0, seeds=1,
                             arm_steps=None, lrs=None, rlvr=False,
                             precisions=None, kl=None, policies=None)
  c = ml_collections.ConfigDict()
  c.seed = arg.seed
  c.seeds = arg.seeds  # the grid runs seeds seed, seed + 1, ...
  c.vocab_size = 512
  c.batch_size = 32  # of the teacher's and student's own training
  c.max_prompt_len = 40
  c.max_new_tokens = 56
  # Arithmetic chains of 3-6 numbers for the teacher (arith_train of each
  # length), a share of the 3-number ones for the student; the grid
  # distils on distill_prompts 4-number problems; test suites held out.
  c.data = dict(arith_train=1500, addition_train=2000, distill_prompts=2000,
                id_test=200, harder_test=200, addition_test=96, data_seed=0)
  # AdamW, linear warm-up over the fraction `warmup` of the steps, cosine
  # decay to 10 %. The teacher's schedule is the gentle one of the module
  # docstring ("The teacher"): the same accuracy from seed to seed.
  c.teacher = dict(arch=TEACHER, steps=600, lr=2e-3, warmup=0.1)
  # The student has the capacity but saw less: every 3-number chain, only
  # 30 % of the 4-number ones (it writes their three steps but fetches the
  # last operand wrongly, 11-15 % correct) and none longer, so it starts
  # weak where the teacher is far ahead (about 63 %).
  c.student = dict(arch=STUDENT, steps=500, lr=3e-3, warmup=0.05,
                   arith_share=1.0, id_share=0.3)
  # On-policy vs off-policy at both ends of the spectrum; --spectrum adds the
  # mixtures in between.
  c.grid = dict(kl=("forward", "reverse"),
                policy=(("student", 1.0), ("teacher", -1.0)),
                lrs=(5e-7, 2e-4), steps=320, batch_size=16,
                # Each model's policy temperature, in rollouts and in the
                # loss (the paper's: student 1.0, teacher 0.5); sampled
                # evaluation and RLVR sample the student at its own.
                student_temperature=1.0, teacher_temperature=0.5,
                # How the student's weights are stored and updated: float32
                # master weights, or bfloat16 with no float32 copy (bf16
                # Adam moments too; train/optim.py). Several: a grid axis.
                precisions=("float32",))
  # Update sparsity: the paper's S_tau (float32, strict <) at each tau, and
  # the former |delta| <= sparsity_atol in bf16 / f32 (docs/method.md).
  c.eval = dict(num_samples=4, ks=(1, 4), batch_size=128,
                sparsity_taus=(1e-6, 1e-8), sparsity_atol=1e-5)
  # RLVR after the grid (--rlvr): GRPO on the distillation prompts, rewards
  # from the arithmetic verifier, `prompts` x `group_size` samples per
  # iteration; from the best arm of each group of `per` (all its seeds).
  # lr 1e-4 (Adam): at 3e-4 the reward fell within 50 iterations.
  c.rlvr = dict(enabled=arg.rlvr, iterations=120, lr=1e-4, group_size=8,
                prompts=16, minibatches=2, per=("kl", "policy"))
  if arg.spectrum:  # one learning rate, five points along the rollout spectrum
    c.grid.update(policy=SPECTRUM, lrs=(5e-4,))
  if arg.quick:
    c.data.update(arith_train=200, addition_train=400, distill_prompts=64,
                  id_test=24, harder_test=16, addition_test=16)
    c.teacher.update(steps=60)
    c.student.update(steps=40)
    c.grid.update(kl=("forward", "reverse"), lrs=(5e-4,), steps=3,
                  batch_size=8)
    if not arg.spectrum:
      c.grid.policy = (("student", 1.0),)
    c.eval.update(num_samples=2, ks=(1, 2), batch_size=32)
    c.rlvr.update(iterations=2, group_size=2, prompts=4)
  # The arguments are refused by name here; the settings they make are
  # checked with the rest by jaxdistill.demo.checks before any work.
  if arg.arm_steps is not None:
    if isinstance(arg.arm_steps, bool) or not isinstance(arg.arm_steps, int) \
        or arg.arm_steps < 1:
      raise ValueError("config arg arm_steps: must be an integer >= 1 (steps "
                       f"per arm), got {arg.arm_steps!r}")
    c.grid.steps = arg.arm_steps
  if arg.lrs is not None:
    c.grid.lrs = _lrs(arg.lrs)
  # '+'-separated: precisions=float32+bfloat16, kl=forward,
  # policies=student+teacher (names of SPECTRUM's points).
  if arg.precisions is not None:
    c.grid.precisions = _names(arg.precisions)
  if arg.kl is not None:
    c.grid.kl = _names(arg.kl)
  if arg.policies is not None:
    want = _names(arg.policies)
    known = dict(SPECTRUM)  # student, teacher and the spectrum's points
    unknown = [p for p in want if p not in known]
    if unknown:
      raise ValueError(f"config arg policies: {unknown[0]!r} is not one of "
                       f"{tuple(known)}")
    c.grid.policy = tuple((p, known[p]) for p in want)
  return c


def _names(text) -> tuple[str, ...]:
  return tuple(x for x in str(text).split("+") if x)


def _lrs(text) -> tuple[float, ...]:
  """'1e-4+5e-4' -> (1e-4, 5e-4): learning rates, each finite and > 0."""
  try:
    lrs = tuple(float(x) for x in str(text).split("+"))
  except ValueError:
    lrs = ()
  if not lrs or not all(0 < x < float("inf") for x in lrs):
    raise ValueError("config arg lrs: learning rates > 0 joined by '+' (e.g. "
                     f"lrs=1e-4+5e-4), got {text!r}")
  return lrs
