"""The generic tuner and stored winners (helios.bench.tuner, selection.choose): a winner is used for exactly its
(device, family, shape, dtype), a stale or unfit one is ignored, a candidate that does not run is never stored,
and `bench tune` tunes a config end to end and lists every family with choices."""

from __future__ import annotations

import dataclasses
import json

import pytest

from helios.kernels.contract import selection
from helios.kernels.contract.tuning import STORE, key


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty tuning store in a cache directory of this test's own."""
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    STORE.forget()
    yield STORE
    STORE.forget()


@pytest.fixture
def info():
    from helios.device import get_device

    return get_device().info


def test_a_stored_winner_is_used_for_exactly_its_device_family_shape_and_dtype(store, info):
    shape = (1024, "sum")
    assert selection.choose("reduce_all", shape, "f32", info=info) == "sum_vec4"  # the table
    store.save(info, "reduce_all", {key(selection.shape_key(shape)): "scalar"})
    assert selection.choose("reduce_all", shape, "f32", info=info) == "sum_scalar"
    assert selection.choose("reduce_all", (1028, "sum"), "f32", info=info) == "sum_vec4"  # another shape
    assert selection.choose("reduce_all", shape, "bf16", info=info) == "bf16_sum_vec4"  # another dtype
    other = dataclasses.replace(info, name=info.name + " (another)")  # another device key
    assert selection.choose("reduce_all", shape, "f32", info=other) == "sum_vec4"
    assert selection.choose("rope", (4, 2, 2, 16, False), "f32", info=info) == "vec4"  # another family
    with selection.forcing("reduce_all", "vec4"):  # a forced choice still wins
        assert selection.choose("reduce_all", shape, "f32", info=info) == "sum_vec4"


def test_a_stale_unfit_or_table_winner_is_ignored(store, info):
    shape = (1024, "sum")
    store.save(info, "reduce_all", {key(selection.shape_key(shape)): "vec8"})  # no longer a choice
    assert selection.choose("reduce_all", shape, "f32", info=info) == "sum_vec4"
    store.save(info, "reduce_all", {key(selection.shape_key(shape)): selection.TABLE})
    assert selection.choose("reduce_all", shape, "f32", info=info) == "sum_vec4"
    bare = dataclasses.replace(info, float_atomic_add_buffer=False, buffer_device_address=False)
    emb = (64, 100, 16, False)
    store.save(bare, "embedding_backward", {key(selection.shape_key(emb)): "atomic"})  # the rule refuses it here
    assert selection.choose("embedding_backward", emb, "f32", info=bare) == "scan"
    store.save(bare, "adamw", {key("4096"): "vec4_addr"})  # needs device addresses
    assert selection.choose("adamw", (4096,), "f32", info=bare) == "vec4"


def test_the_tuner_never_stores_a_candidate_that_does_not_run(store, info):
    from helios.bench import tuner

    bare = dataclasses.replace(info, float_atomic_add_buffer=False)
    shape = (64, 100, 16, True)  # planned: the table takes "sorted"
    table, cands = tuner.candidates(bare, "embedding_backward", shape, "f32")
    assert table == "sorted" and list(cands) == ["scan"]  # "atomic" refused, "deterministic" plans the table's

    def step():  # a launch the device contract refuses whenever "scan" is chosen
        if selection.choose("embedding_backward", shape, "f32", info=bare) == "scan":
            raise ValueError("refused by the device contract")

    report = tuner.tune(step, info=bare, families={"embedding_backward"}, budget_s=30, repeats=1, warmup=0)
    assert [(t.family, t.winner) for t in report.trials] == [("embedding_backward", "sorted")]
    assert store.winners(bare, "embedding_backward") == {key(selection.shape_key(shape)): selection.TABLE}


def test_the_table_label_names_what_runs_not_a_choice_that_gives_way_to_it(info):
    from helios.bench import tuner

    shape = ("nt", 256, 384, 128, 1)
    no_int64 = dataclasses.replace(info, int64=False, profile="gpu")  # SwiftShader's GPU profile
    table = selection.declared("matmul").rule(no_int64, shape, "f32", None)
    assert table.startswith("tiled")  # register tilings need int64: forcing reg8x8 gives way to this table
    assert tuner.table_label(no_int64, "matmul", shape, "f32", table) == table  # not "reg8x8", the first candidate
    lavapipe = selection.declared("matmul").rule(info, shape, "f32", None)
    assert tuner.table_label(info, "matmul", shape, "f32", lavapipe) == lavapipe  # negative control: runs as is


def test_a_winner_must_not_cost_more_cpu_than_the_table_on_a_cpu_driver():
    from helios.bench.tuner import confirmed

    table = (30.0, 40.0)  # (wall ms, process CPU ms) of the table's step in the second sitting
    assert confirmed(table, (20.0, 38.0), 0.02, cpu_device=True)  # faster, no more CPU: a winner
    assert confirmed(table, (20.0, 40.5), 0.02, cpu_device=True)  # the same work spread wider: within the margin
    # looked faster only because the table's sitting was slowed by other programs: more CPU for the same step
    assert not confirmed(table, (20.0, 90.0), 0.02, cpu_device=True)
    assert confirmed(table, (20.0, 90.0), 0.02, cpu_device=False)  # a GPU's host CPU time says nothing of it
    assert not confirmed(table, (29.8, 10.0), 0.02, cpu_device=True)  # not faster on the wall clock by the margin


def test_time_step_cpu_counts_the_cpu_a_step_spends_not_its_waits():
    import time

    from helios.bench.tuner import time_step_cpu

    def busy():
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass

    wall, cpu = time_step_cpu(lambda: time.sleep(0.02), lambda: None, repeats=3, warmup=0)
    assert wall >= 19 and cpu < 10  # a wait: wall time, no CPU
    wall, cpu = time_step_cpu(busy, lambda: None, repeats=3, warmup=0)
    assert cpu >= 19  # negative control: work shows as CPU time


def test_a_truly_faster_candidate_wins_all_three_sittings_and_a_slower_one_never(store, info):
    import time

    from helios.bench import tuner

    bare = dataclasses.replace(info, float_atomic_add_buffer=False)
    shape = (64, 100, 16, True)  # candidates: the table's "sorted" and "scan" (tested above)

    def step_where(scan_ms: float, sorted_ms: float):
        def step():  # waits, spending no CPU: only the wall clock tells the choices apart
            chosen = selection.choose("embedding_backward", shape, "f32", info=bare)
            time.sleep((scan_ms if chosen == "scan" else sorted_ms) / 1e3)
        return step

    report = tuner.tune(step_where(2, 30), info=bare, families={"embedding_backward"}, budget_s=30, repeats=1,
                        warmup=0)
    assert [(t.winner, t.table) for t in report.trials] == [("scan", "sorted")]
    assert store.winners(bare, "embedding_backward") == {key(selection.shape_key(shape)): "scan"}
    store.forget()
    store.save(bare, "embedding_backward", {key(selection.shape_key(shape)): selection.TABLE})
    report = tuner.tune(step_where(30, 2), info=bare, families={"embedding_backward"}, budget_s=30, repeats=1,
                        warmup=0)  # negative control: slower, never stored
    assert [t.winner for t in report.trials] == ["sorted"]
    assert store.winners(bare, "embedding_backward") == {key(selection.shape_key(shape)): selection.TABLE}


def test_the_kernel_clock_compares_only_the_launches_a_choice_changes():
    from helios.bench.tuner import differing_ms

    def run(noise: float, mm: str, mm_ms: float):  # a step: a noisy kernel, the tuned launch, another noisy one
        return [("layernorm", "sg", 5.0 + noise), ("matmul_nn", mm, mm_ms), ("adamw", "vec4", 3.0 + noise)]

    table = [run(0.0, "reg32x8ak", 1.0), run(40.0, "reg32x8ak", 1.2), run(1.0, "reg32x8ak", 1.1)]
    fast = [run(30.0, "reg8x8", 0.5), run(25.0, "reg8x8", 0.6), run(35.0, "reg8x8", 0.7)]
    assert differing_ms(table, fast) == (1.1, 0.6)  # the whole steps' noise (tens of ms) does not enter
    same = [run(9.0, "reg32x8ak", 1.0)]  # negative control: nothing differs, the whole steps are compared
    assert differing_ms([run(0.0, "reg32x8ak", 1.0)], same) == (9.0, 27.0)


def test_the_kernel_clock_lines_up_choices_that_change_the_dispatch_count():
    """A plan with more or fewer dispatches (two-pass sums, K chunks, a fused Delta) is timed by the launches it
    adds, drops or replaces, wherever they sit in the step, not by the noisy whole step."""
    from helios.bench.tuner import differing_ms

    def step(noise: float, middle: list):
        return [("layernorm", "sg", 5.0 + noise), *middle, ("adamw", "vec4", 3.0 + noise),
                *[(k, v, ms / 2) for k, v, ms in middle], ("embedding", "vec4", 2.0 + noise)]

    one = [("sum_rows", "u64x2", 0.4)]
    two = [("sum_rows", "u64x2", 0.1), ("sum_rows", "scalar", 0.1)]
    table = [step(0.0, one), step(30.0, one), step(2.0, one)]
    cand = [step(20.0, two), step(1.0, two), step(40.0, two)]
    assert differing_ms(table, cand) == pytest.approx((0.6, 0.3))  # 0.4 + 0.2 against (0.1 + 0.1) * 1.5
    chunks = [("matmul_tn", "reg32x8ak", 0.5)] * 3
    assert differing_ms([step(0.0, [("matmul_tn", "reg32x8ak", 2.0)])], [step(9.0, chunks)]) == \
        pytest.approx((3.0, 2.25))


def test_the_kernel_clock_tells_launches_of_one_variant_apart():
    """kernel_runs' fourth field (pipeline and grid): a plan that changes only a launch's grid (grad_norm's
    workgroup count) is timed by that launch, not by the noisy whole step; the same launch everywhere falls back to
    the whole steps."""
    from helios.bench.tuner import differing_ms

    def step(noise: float, groups: int, ms: float):
        return [("layernorm", "sg", 5.0 + noise, (1, 4, 1, 1)),
                ("grad_norm_partial", "vec4_lanes", ms, (2, groups, 1, 1)),
                ("adamw", "vec4", 3.0 + noise, (3, 9, 1, 1))]

    assert differing_ms([step(0.0, 16, 0.4), step(30.0, 16, 0.5)], [step(20.0, 3, 0.2), step(1.0, 3, 0.3)]) == \
        pytest.approx((0.45, 0.25))
    assert differing_ms([step(0.0, 16, 0.4)], [step(9.0, 16, 0.4)]) == pytest.approx((8.4, 26.4))


def test_a_question_about_another_family_is_not_recorded():
    """matmul asks the sum_rows rule whether it would sum in one pass (a_sums) without launching it: the tuner's
    recording must not list sum_rows at that shape."""
    from helios.kernels.rows.reduce import sums_in_one_pass

    with selection.recording() as calls:
        sums_in_one_pass(256, 128, "f32")
        selection.choose("sum_rows", (64, 128, True, True))
    assert list(calls) == [("sum_rows", (64, 128, True, True), "f32")]


TINY = """[model]
n_layer = 1
n_head = 2
n_embd = 32
block_size = 16
vocab_size = 320
[train]
batch_size = 2
"""


def test_bench_tune_a_config_writes_winners_and_prints_the_table(store, info, tmp_path, capsys):
    from helios.bench.__main__ import main

    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    assert main(["tune", str(config), "--budget-s", "20", "--quick", "--families", "rows,elementwise,adamw"]) == 0
    out = capsys.readouterr().out
    assert "table" in out.splitlines()[0] and "winner" in out.splitlines()[0] and "speed-up" in out
    data = json.loads(store.path(info).read_text())
    tuned = [f for f in ("rows", "elementwise", "adamw") if data.get(f)]
    assert tuned, data
    for fam in tuned:
        assert fam in out
        labels = {selection.label(c) for c in selection.declared(fam).candidates} | {selection.TABLE}
        assert set(data[fam].values()) <= labels


def test_bench_tune_names_families_the_step_never_launches(store, info, tmp_path, capsys):
    """Families asked for that a config's training step never runs (sampling's decode families) are named: alone
    they are an error with a non-zero exit and nothing stored; beside others, a line of the summary."""
    from helios.bench.__main__ import main

    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    with pytest.raises(SystemExit) as refused:
        main(["tune", str(config), "--quick", "--families", "decode,decode_kernels"])
    assert "never launches decode, decode_kernels" in str(refused.value.code) and "trainer sample" in \
        str(refused.value.code)
    assert not store.path(info).exists()
    assert main(["tune", str(config), "--budget-s", "20", "--quick", "--dry-run", "--families", "adamw,decode"]) == 0
    assert "not in this config's training step (their table stays): decode" in capsys.readouterr().out


def test_bench_tune_help_lists_every_family_with_choices(capsys):
    from helios.bench.__main__ import main

    with pytest.raises(SystemExit) as done:
        main(["tune", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    with_choices = [f.name for f in selection.families() if len(f.candidates) > 1]
    assert {"matmul", "attention", "rows", "adamw", "cross_entropy"} <= set(with_choices)
    for name in with_choices:
        assert f"  {name}: " in out
