"""The GPU benchmark (`rgpo_lab.benchmarks.gpu_step`) in its tiny CPU mode: every block runs for real on a
tiny Qwen2 (one case made to fail once), and the reported numbers are recomputed from the CSV rows; the budget
stop is checked on a fake clock."""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from rgpo_lab.benchmarks import gpu_step

TINY_LENGTH = 8  # prompt and completion tokens in tiny mode


def read_rows(out) -> list[dict]:
    with open(out / "gpu_step.csv") as f:
        return list(csv.DictReader(f))


def number(value: str) -> float | None:
    return None if value == "" else float(value)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """All three blocks, two rounds; the second PPO run raises while its trainer is built."""
    out = tmp_path_factory.mktemp("gpu_tiny")
    build, calls = gpu_step.build_trainer, {"ppo": 0}

    def failing_build(case, *args, **kwargs):
        if case.method == "ppo":
            calls["ppo"] += 1
            if calls["ppo"] == 2:
                raise RuntimeError("injected failure\nsecond line")
        return build(case, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpu_step, "build_trainer", failing_build)
        code = gpu_step.main(["--tiny", "--rounds", "2", "--out", str(out)])
    return code, out, read_rows(out), json.loads((out / "gpu_step.json").read_text())


def test_every_run_is_recorded_in_interleaved_order(tiny_run):
    code, _, rows, report = tiny_run
    assert code == 1 and report["status"] == "failed"  # one case failed, the others still ran
    expected = []
    for block, cases in gpu_step.BLOCKS.items():
        names = [c.name for c in cases]
        for r in range(2):
            order = names[r % len(names) :] + names[: r % len(names)]  # rotated by the round
            expected += [(block, str(r), str(p), name) for p, name in enumerate(order)]
    assert [(r["block"], r["round"], r["position"], r["case"]) for r in rows] == expected
    assert rows == [{k: ("" if v is None else str(v)) for k, v in row.items()} for row in report["rows"]]


def test_failing_case_is_recorded_and_left_out_of_its_ratio(tiny_run):
    _, out, rows, report = tiny_run
    failed = [r for r in rows if r["status"] != "ok"]
    assert [(r["block"], r["round"], r["case"], r["status"]) for r in failed] == [
        ("full_1.5b", "1", "ppo", "failed")
    ]
    assert failed[0]["error"] == "RuntimeError: injected failure" and failed[0]["step_time_s"] == ""
    ratios = report["summary"]["full_1.5b"]["ratios"]
    assert ratios["rgpo/ppo"]["step_time_s"]["rounds"] == 1
    assert ratios["rgpo/grpo_ref"]["step_time_s"]["rounds"] == 2
    assert "full_1.5b round 1 ppo: failed RuntimeError: injected failure" in (out / "gpu_step.md").read_text()


def test_ratios_recomputed_from_the_csv_rows(tiny_run):
    _, out, rows, report = tiny_run
    md = (out / "gpu_step.md").read_text()
    checked = 0
    for block, pairs in gpu_step.RATIOS.items():
        for num, den in pairs:
            for key in ("step_time_s", "generation_s"):
                by_round = {}
                for r in rows:
                    if r["block"] == block and r["status"] == "ok":
                        by_round.setdefault(r["round"], {})[r["case"]] = float(r[key])
                per_round = [v[num] / v[den] for v in by_round.values() if num in v and den in v]
                reported = report["summary"][block]["ratios"][f"{num}/{den}"][key]
                assert reported["median"] == pytest.approx(statistics.median(per_round), rel=1e-12)
                assert (reported["min"], reported["max"]) == pytest.approx((min(per_round), max(per_round)))
                checked += 1
            assert (
                f"**{report['summary'][block]['ratios'][f'{num}/{den}']['step_time_s']['median']:.3f}**" in md
            )
    assert checked == 12
    for block in gpu_step.BLOCKS:
        for name, c in report["summary"][block]["per_case"].items():
            ok = [
                float(r["step_time_s"])
                for r in rows
                if (r["block"], r["case"], r["status"]) == (block, name, "ok")
            ]
            assert c["runs_ok"] == len(ok) and c["step_time_s"] == pytest.approx(statistics.median(ok))


def test_tokens_are_the_batch_times_the_forced_length(tiny_run):
    _, _, rows, report = tiny_run
    setup = report["setup"]
    batch = setup["prompts"] * setup["generations"]
    assert batch == 16 and setup["completion_length"] == TINY_LENGTH
    for r in (r for r in rows if r["status"] == "ok"):
        assert float(r["completion_tokens_per_generation"]) == batch * TINY_LENGTH, r["case"]
        assert float(r["prompt_tokens_per_generation"]) == batch * TINY_LENGTH, r["case"]
        # one measured generation per num_iterations optimizer steps
        steps, gen, step = int(r["steps_measured"]), float(r["generation_s"]), float(r["step_time_s"])
        assert steps == setup["num_iterations"] * setup["measured_iterations"]
        assert float(r["generation_share"]) == pytest.approx(
            gen * steps / setup["num_iterations"] / (step * steps)
        )
        assert 0 < float(r["generation_share"]) < 1
        assert float(r["tokens_per_s"]) == pytest.approx(batch * TINY_LENGTH / gen)
        assert r["peak_memory_gib"] == r["memory_at_start_gib"] == ""  # null on CPU


def test_outputs_name_the_machine_versions_and_command(tiny_run):
    _, _, _, report = tiny_run
    assert report["command"].startswith("python -m rgpo_lab.benchmarks.gpu_step --tiny")
    assert {"torch", "transformers", "trl", "peft"} <= set(report["environment"]["versions"])
    assert report["environment"]["machine"]["gpu"] is None and report["environment"]["machine"]["cpu_count"]


def test_budget_stop_records_what_did_not_fit(tmp_path, monkeypatch):
    """Fake runs of 3 s on a fake clock, a 26 s budget: the eight runs of full_1.5b fit (5 s left before the
    last); the first LoRA run is estimated from the longest run so far (3 s > the 2 s left), so it and
    everything after it are recorded as not run; the outputs were on disk while each run went."""
    clock = {"t": 0.0}
    seen = []

    def fake_run(case, setup, model_dir):
        seen.append([r["status"] for r in read_rows(tmp_path)])
        clock["t"] += 3.0
        return {"step_time_s": 1.0, "generation_s": 0.5}

    monkeypatch.setattr(gpu_step, "now", lambda: clock["t"])
    monkeypatch.setattr(gpu_step, "run_case", fake_run)
    budget = str(26 / 60)
    code = gpu_step.main(
        ["--tiny", "--blocks", "full_1.5b", "lora_7b", "--budget-minutes", budget, "--out", str(tmp_path)]
    )
    rows = read_rows(tmp_path)
    assert code == 3
    assert [r["status"] for r in rows] == ["ok"] * 8 + ["not_run_budget"] * 4
    assert rows[8]["error"] == "2 s left of the budget" and rows[8]["block"] == "lora_7b"
    assert seen[1] == ["ok", "running"] + ["pending"] * 10  # a killed run would leave these on disk
    report = json.loads((tmp_path / "gpu_step.json").read_text())
    assert report["status"] == "budget"
    assert report["summary"]["full_1.5b"]["ratios"]["rgpo/ppo"]["step_time_s"]["median"] == 1.0
    assert report["summary"]["lora_7b"]["ratios"]["rgpo/grpo_ref"]["step_time_s"]["median"] is None
    assert "lora_7b round 1 rgpo: not_run_budget" in (tmp_path / "gpu_step.md").read_text()


def test_bad_options_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        gpu_step.main(["--tiny", "--rounds", "0"])
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err
