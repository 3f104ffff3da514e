"""collectives: bytes per device of a compiled program's collectives, on HLO
text written here by hand (the forms the TPU compiler prints: mesh, iota
and explicit replica groups, async starts, collectives inside fusions,
while loops with and without a trip count written), against counts done by
hand from the shapes."""
import pytest

from jaxdistill import collectives

# Outer loop: i from 0 while i < 3 (3 trips, read from the loop). Its body:
#  an all-reduce of bf16[64] (128 B) over iota groups of 2, and an inner loop
#  with XLA's known_trip_count 4 whose body all-gathers f32[2,128] (1 KiB)
#  over the mesh axis of 4, inside a fusion (the TPU's async collective
#  fusions), and starts a collective-permute of s32[16] (64 B).
# Entry: a reduce-scatter of f32[8,32] (1 KiB) over {{0,1,2,3}} wrapped in
#  async-start/-done; an all-gather-start of bf16[4,4] (32 B) over 4 ending
#  in all-gather-done; a conditional whose branches all-to-all 256 B / 512 B
#  over 4; a decode-like loop (j + 1 < 9 and not done, j from 1: at most 7
#  trips) whose condition all-reduces a u32 flag (4 B) over 4 and whose body
#  all-gathers f32[8] (32 B) over 2; a loop whose bound is an argument
#  (trip count unknown) holding an all-reduce of f32[16] (64 B) over 4; and
#  an async collective fusion as the TPU compiler writes it: an all-gather
#  of bf16[4,8] (64 B) over 4 in its start fusion and again in its done
#  fusion, one channel_id (one collective), with a continuation fusion
#  holding a third copy inside the decode-like loop's body (the TPU
#  compiler overlaps a gather with a loop so): still one collective, run
#  once.
HLO = """\
HloModule jit_f, is_scheduled=true, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%gather_fusion (p.0: f32[2,128]) -> f32[8,128] {
  %p.0 = f32[2,128]{1,0:T(2,128)} parameter(0)
  ROOT %all-gather.1 = f32[8,128]{1,0:T(8,128)} all-gather(%p.0), channel_id=1, replica_groups=mesh['axis_0'=1,'axis_1'=4] {'axis_1'}, dimensions={0}, use_global_device_ids=true
}

%inner_body (ib: (s32[], f32[2,128], s32[16])) -> (s32[], f32[2,128], s32[16]) {
  %ib = (s32[]{:T(128)}, f32[2,128]{1,0:T(2,128)}, s32[16]{0}) parameter(0)
  %gte.i = s32[]{:T(128)} get-tuple-element(%ib), index=0
  %gte.x = f32[2,128]{1,0:T(2,128)} get-tuple-element(%ib), index=1
  %gte.p = s32[16]{0} get-tuple-element(%ib), index=2
  %fusion.g = f32[8,128]{1,0:T(8,128)} fusion(%gte.x), kind=kCustom, calls=%gather_fusion
  %slice.1 = f32[2,128]{1,0} slice(%fusion.g), slice={[0:2], [0:128]}
  %cp-start = (s32[16]{0}, s32[16]{0}, u32[], u32[]) collective-permute-start(%gte.p), channel_id=2, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %cp-done = s32[16]{0} collective-permute-done(%cp-start)
  %one = s32[] constant(1)
  %next = s32[] add(%gte.i, %one)
  ROOT %t = (s32[], f32[2,128], s32[16]) tuple(%next, %slice.1, /*index=2*/%cp-done)
}

%inner_cond (ic: (s32[], f32[2,128], s32[16])) -> pred[] {
  %ic = (s32[], f32[2,128], s32[16]) parameter(0)
  %gte.c = s32[] get-tuple-element(%ic), index=0
  %unknowable = s32[] constant(1000)
  ROOT %lt.i = pred[] compare(%gte.c, %unknowable), direction=NE
}

%outer_body (ob: (s32[], f32[2,128], bf16[64], s32[16])) -> (s32[], f32[2,128], bf16[64], s32[16]) {
  %ob = (s32[], f32[2,128], bf16[64], s32[16]) parameter(0)
  %gte.oi = s32[] get-tuple-element(%ob), index=0
  %copy.oi = s32[] copy(%gte.oi)
  %gte.ox = f32[2,128] get-tuple-element(%ob), index=1
  %gte.ov = bf16[64] get-tuple-element(%ob), index=2
  %gte.op = s32[16] get-tuple-element(%ob), index=3
  %all-reduce.1 = bf16[64]{0} all-reduce(%gte.ov), channel_id=3, replica_groups=[2,2]<=[4], to_apply=%add
  %zero = s32[] constant(0)
  %init.in = (s32[], f32[2,128], s32[16]) tuple(%zero, %gte.ox, %gte.op)
  %while.in = (s32[], f32[2,128], s32[16]) while(%init.in), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"4"}}
  %gte.r = f32[2,128] get-tuple-element(%while.in), index=1
  %gte.rp = s32[16] get-tuple-element(%while.in), index=2
  %one.o = s32[] constant(1)
  %next.o = s32[] add(%copy.oi, %one.o)
  ROOT %t.o = (s32[], f32[2,128], bf16[64], s32[16]) tuple(%next.o, %gte.r, %all-reduce.1, %gte.rp)
}

%outer_cond (oc: (s32[], f32[2,128], bf16[64], s32[16])) -> pred[] {
  %three = s32[] constant(3)
  %oc = (s32[], f32[2,128], bf16[64], s32[16]) parameter(0)
  %gte.oc = s32[] get-tuple-element(%oc), index=0
  ROOT %lt.o = pred[] compare(%gte.oc, %three), direction=LT
}

%rs_wrapped (w.0: f32[8,32]) -> f32[2,32] {
  %w.0 = f32[8,32] parameter(0)
  ROOT %reduce-scatter.1 = f32[2,32] reduce-scatter(%w.0), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
}

%branch_a (a.0: f32[64]) -> f32[64] {
  %a.0 = f32[64] parameter(0)
  ROOT %all-to-all.a = f32[64] all-to-all(%a.0), channel_id=5, replica_groups={{0,1,2,3}}, dimensions={0}
}

%branch_b (b.0: f32[64]) -> f32[128] {
  %b.0 = f32[64] parameter(0)
  %cat = f32[128] concatenate(%b.0, %b.0), dimensions={0}
  ROOT %all-to-all.b = f32[128] all-to-all(%cat), channel_id=6, replica_groups={{0,1,2,3}}, dimensions={0}
}

%ag_cont (c.0: bf16[4,8]) -> bf16[4,8] {
  %c.0 = bf16[4,8]{1,0} parameter(0)
  %all-gather.c = bf16[16,8]{1,0} all-gather(%c.0), channel_id=11, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %cc.c = bf16[4,8]{1,0} custom-call(%c.0, %all-gather.c), custom_call_target="AsyncCollectiveContinuation"
}

%decode_body (db: (s32[], f32[8], pred[])) -> (s32[], f32[8], pred[]) {
  %db = (s32[], f32[8], pred[]) parameter(0)
  %dj = s32[] get-tuple-element(%db), index=0
  %dx = f32[8] get-tuple-element(%db), index=1
  %dd = pred[] get-tuple-element(%db), index=2
  %ag.d = f32[16] all-gather(%dx), channel_id=7, replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}, dimensions={0}
  %cz = bf16[] constant(0)
  %hc = bf16[4,8]{1,0} broadcast(%cz), dimensions={}
  %acc = bf16[4,8]{1,0} fusion(%hc), kind=kCustom, calls=%ag_cont
  %ds = f32[8] slice(%ag.d), slice={[0:8]}
  %one.d = s32[] constant(1)
  %dj1 = s32[] add(%one.d, %dj)
  ROOT %dt = (s32[], f32[8], pred[]) tuple(%dj1, %ds, %dd)
}

%decode_cond (dc: (s32[], f32[8], pred[])) -> pred[] {
  %dc = (s32[], f32[8], pred[]) parameter(0)
  %dcj = s32[] get-tuple-element(%dc), index=0
  %dcd = pred[] get-tuple-element(%dc), index=2
  %flag = u32[] convert(%dcd)
  %all-reduce.f = u32[] all-reduce(%flag), channel_id=8, replica_groups=mesh['axis_0'=4] {'axis_0'}, to_apply=%add
  %flagp = pred[] convert(%all-reduce.f)
  %one.c = s32[] constant(1)
  %dcj1 = s32[] add(%dcj, %one.c)
  %nine = s32[] constant(9)
  %lt.d = pred[] compare(%nine, %dcj1), direction=GT
  %not.d = pred[] not(%flagp)
  ROOT %and.d = pred[] and(%lt.d, %not.d)
}

%free_body (fb: (s32[], f32[16], s32[])) -> (s32[], f32[16], s32[]) {
  %fb = (s32[], f32[16], s32[]) parameter(0)
  %fi = s32[] get-tuple-element(%fb), index=0
  %fx = f32[16] get-tuple-element(%fb), index=1
  %fn = s32[] get-tuple-element(%fb), index=2
  %all-reduce.u = f32[16] all-reduce(%fx), channel_id=9, replica_groups={}, to_apply=%add
  %one.f = s32[] constant(1)
  %fi1 = s32[] add(%fi, %one.f)
  ROOT %ft = (s32[], f32[16], s32[]) tuple(%fi1, %all-reduce.u, %fn)
}

%free_cond (fc: (s32[], f32[16], s32[])) -> pred[] {
  %fc = (s32[], f32[16], s32[]) parameter(0)
  %fci = s32[] get-tuple-element(%fc), index=0
  %fcn = s32[] get-tuple-element(%fc), index=2
  ROOT %lt.f = pred[] compare(%fci, %fcn), direction=LT
}

%ag_start (s.0: bf16[4,8]) -> (bf16[4,8], bf16[16,8]) {
  %s.0 = bf16[4,8]{1,0} parameter(0)
  %all-gather.s = bf16[16,8]{1,0} all-gather(%s.0), channel_id=11, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %cc.s = (bf16[4,8]{1,0}, bf16[16,8]{1,0}) custom-call(%s.0, %all-gather.s), custom_call_target="AsyncCollectiveStart"
}

%ag_done (d.0: bf16[4,8], d.1: bf16[16,8]) -> bf16[16,8] {
  %d.0 = bf16[4,8]{1,0} parameter(0)
  %d.1 = bf16[16,8]{1,0} parameter(1)
  %all-gather.d = bf16[16,8]{1,0} all-gather(%d.0), channel_id=11, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %cc.d = bf16[16,8]{1,0} custom-call(%d.0, %d.1, %all-gather.d), custom_call_target="AsyncCollectiveDone"
}

ENTRY %main (x: f32[2,128], v: bf16[64], q: s32[16], r: f32[8,32], g: bf16[4,4], c: pred[], e: f32[64], n: s32[], h: bf16[4,8]) -> f32[2,128] {
  %x = f32[2,128] parameter(0)
  %v = bf16[64] parameter(1)
  %q = s32[16] parameter(2)
  %r = f32[8,32] parameter(3)
  %g = bf16[4,4] parameter(4)
  %c = pred[] parameter(5)
  %e = f32[64] parameter(6)
  %n = s32[] parameter(7)
  %h = bf16[4,8] parameter(8)
  %acs = (bf16[4,8], bf16[16,8]) fusion(%h), kind=kCustom, calls=%ag_start
  %acs.0 = bf16[4,8] get-tuple-element(%acs), index=0
  %acs.1 = bf16[16,8] get-tuple-element(%acs), index=1
  %acd = bf16[16,8] fusion(%acs.0, %acs.1), kind=kCustom, calls=%ag_done
  %zero.e = s32[] constant(0)
  %copy.z = s32[] copy(%zero.e)
  %init.o = (s32[], f32[2,128], bf16[64], s32[16]) tuple(%copy.z, %x, %v, %q)
  %while.out = (s32[], f32[2,128], bf16[64], s32[16]) while(%init.o), condition=%outer_cond, body=%outer_body, metadata={op_name="jit(f)/while"}
  %async-start = ((f32[8,32]), f32[2,32], u32[]) async-start(%r), calls=%rs_wrapped
  %async-done = f32[2,32] async-done(%async-start), calls=%rs_wrapped
  %ag-start = (bf16[4,4], bf16[16,4]) all-gather-start(%g), channel_id=10, replica_groups={{0,1,2,3}}, dimensions={0}
  %ag-done = bf16[16,4] all-gather-done(%ag-start)
  %cond.1 = f32[64] conditional(%c, %e, %e), true_computation=%branch_a, false_computation=%branch_b
  %one.e = s32[] constant(1)
  %xd = f32[8] slice(%e), slice={[0:8]}
  %false = pred[] constant(false)
  %init.d = (s32[], f32[8], pred[]) tuple(%one.e, %xd, %false)
  %while.dec = (s32[], f32[8], pred[]) while(%init.d), condition=%decode_cond, body=%decode_body
  %xf = f32[16] slice(%e), slice={[0:16]}
  %init.f = (s32[], f32[16], s32[]) tuple(%zero.e, %xf, %n)
  %while.free = (s32[], f32[16], s32[]) while(%init.f), condition=%free_cond, body=%free_body
  ROOT %out = f32[2,128] get-tuple-element(%while.out), index=1
}
"""


def test_count_by_hand():
  r = collectives.count(HLO, devices=4)
  gather_inner = 3 * 4 * (1024 * 3)       # A (n - 1), 4 trips x 3 trips
  permute = 3 * 4 * 64                    # A
  reduce_outer = 3 * 2 * 128 * 1 / 2      # 2 A (n - 1) / n, groups of 2
  scatter = 1024 * 3 / 4                  # A (n - 1) / n
  gather_start = 32 * 3
  to_all = 512 * 3 / 4                    # the costlier branch
  decode = 7 * 32 * 1 + 8 * 2 * 4 * 3 / 4  # body 7 trips, condition 8 runs
  free = 1 * 2 * 64 * 3 / 4               # unknown trips: once, groups={}
  fused = 64 * 3                          # start, continuation, done: one
  assert r["ici_bytes_by_kind"] == {
      "all-gather": gather_inner + gather_start + 7 * 32 + fused,
      "reduce-scatter": scatter,
      "all-reduce": reduce_outer + 8 * 2 * 4 * 3 / 4 + free,
      "all-to-all": to_all,
      "collective-permute": permute}
  assert r["ici_bytes"] == (gather_inner + permute + reduce_outer + scatter
                            + gather_start + to_all + decode + free + fused)
  loops = {l["name"]: (l["trips"], l["trip_count"]) for l in r["ici_loops"]}
  assert loops == {"while.out": (3, "exact"), "while.in": (4, "exact"),
                   "while.dec": (7, "at most"), "while.free": (None, "unknown")}
  assert not r["ici_complete"]
  outer, = [l for l in r["ici_loops"] if l["name"] == "while.out"]
  assert outer["op_name"] == "jit(f)/while"
  assert outer["bytes"] == gather_inner + permute + reduce_outer


@pytest.mark.parametrize("attrs,n", [
    ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, x", 4),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}", 8),
    ("replica_groups=mesh['axis_0'=8] {'axis_0':(2)4}", 4),
    ("replica_groups=[4,2]<=[8], dimensions={0}", 2),
    ("replica_groups={{0,2},{1,3}}, dimensions={0}", 2),
    ("replica_groups={}, to_apply=%add", 8),
    ("channel_id=1", 8)])
def test_group_size(attrs, n):
  assert collectives.group_size(attrs, 8) == n


def test_shape_bytes():
  assert collectives.shape_bytes("bf16[8,512]{1,0:T(8,128)(2,1)S(1)}") == 8192
  assert collectives.shape_bytes("(s32[]{:T(128)}, f32[2,3], pred[4])") == 4 + 24 + 4
  assert collectives.shape_bytes("(f8e4m3fn[8], token[])") == 8


# The GPU compiler's forms (XLA's GPU compiler, jax 0.10.2): a decode-like
# loop whose condition is one loop fusion (j + 1 < 9 and not done, j from 1:
# at most 7 trips) and whose counter comes out of a multi-output fusion; its
# body all-gathers f32[8] (32 B) over iota groups of 4: 3 x 32 B a trip.
GPU_HLO = """\
HloModule jit_g, is_scheduled=true, num_partitions=4

%fused_cond (p0: s32[], p1: pred[]) -> pred[] {
  %p0 = s32[] parameter(0)
  %one = s32[] constant(1)
  %next = s32[] add(%p0, %one)
  %nine = s32[] constant(9)
  %lt = pred[] compare(%next, %nine), direction=LT
  %p1 = pred[] parameter(1)
  %notd = pred[] not(%p1)
  ROOT %and = pred[] and(%lt, %notd)
}

%fused_step (q0: s32[], q1: f32[8]) -> (f32[8], s32[]) {
  %q0 = s32[] parameter(0)
  %q1 = f32[8]{0} parameter(1)
  %c1 = s32[] constant(1)
  %inc = s32[] add(%q0, %c1)
  %neg = f32[8]{0} negate(%q1)
  ROOT %t = (f32[8]{0}, s32[]) tuple(%neg, %inc)
}

%cond (c: (s32[], f32[8], pred[])) -> pred[] {
  %c = (s32[], f32[8]{0}, pred[]) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %d = pred[] get-tuple-element(%c), index=2
  ROOT %f = pred[] fusion(%i, %d), kind=kLoop, calls=%fused_cond
}

%body (b: (s32[], f32[8], pred[])) -> (s32[], f32[8], pred[]) {
  %b = (s32[], f32[8]{0}, pred[]) parameter(0)
  %bi = s32[] get-tuple-element(%b), index=0
  %bx = f32[8]{0} get-tuple-element(%b), index=1
  %bd = pred[] get-tuple-element(%b), index=2
  %ag = f32[32]{0} all-gather(%bx), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}
  %sl = f32[8]{0} slice(%ag), slice={[0:8]}
  %ms = (f32[8]{0}, s32[]) fusion(%bi, %sl), kind=kLoop, calls=%fused_step
  %nx = f32[8]{0} get-tuple-element(%ms), index=0
  %ni = s32[] get-tuple-element(%ms), index=1
  ROOT %r = (s32[], f32[8]{0}, pred[]) tuple(%ni, %nx, %bd)
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %z = s32[] constant(1)
  %f = pred[] constant(false)
  %init = (s32[], f32[8]{0}, pred[]) tuple(%z, %x, %f)
  %w = (s32[], f32[8]{0}, pred[]) while(%init), condition=%cond, body=%body
  ROOT %o = f32[8]{0} get-tuple-element(%w), index=1
}
"""


def test_gpu_fused_loop_condition_read_through():
  """The trip count is read through the fusions (before, 'unknown' and
  the gather counted once: 96 B)."""
  out = collectives.count(GPU_HLO, 4)
  loop, = out["ici_loops"]
  assert (loop["trips"], loop["trip_count"]) == (7, "at most")
  assert out["ici_bytes"] == 7 * 3 * 32
  assert out["ici_complete"]
