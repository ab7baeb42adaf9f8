"""examples/own_model.py, the "your own model" script of the README and the Quickstart, runs as written on the
tiny offline model (the code that trains a hub model), and its closing summary shows RGPO's trust region at
work: KLhat_old reached the target's band and the controller moved the KL-to-old coefficient. The Quickstart's
excerpt of it is the file's own text."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from rgpo_trl.testing import tiny_model, tiny_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "own_model.py")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run_example(cwd, *args: str) -> str:
    env = {**os.environ, **OFFLINE, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": ROOT}
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--cpu", "--output_dir", "out", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def parse_summary(stdout: str) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The summary's head line ("RGPO, 16 optimizer steps (8 iterations), learning rate 0.01:") and its rows
    ("  kl_coef   first 0.5 last 0.0625 raised 0 lowered 3   (note)") as {row: {word: number}}."""
    lines = stdout.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("RGPO, ")]
    assert heads, "no summary in the output:\n" + stdout[-3000:]
    head = re.fullmatch(
        r"RGPO, (\d+) optimizer steps \((\d+) iterations\), learning rate ([-+.e\d]+):", lines[heads[-1]]
    )
    assert head, lines[heads[-1]]
    rows = {}
    for line in lines[heads[-1] + 1 :]:
        match = re.match(r"  (\w+) +(.*?) +\(.*\)$", line)
        assert match, f"not a summary row: {line!r}"
        pairs = match[2].split()
        assert len(pairs) % 2 == 0, line
        rows[match[1]] = {word: float(value) for word, value in zip(pairs[::2], pairs[1::2], strict=True)}
    steps, iterations, learning_rate = head.groups()
    return {"steps": int(steps), "iterations": int(iterations), "learning_rate": float(learning_rate)}, rows


def test_tiny_run_shows_the_trust_region_acting(tmp_path):
    head, rows = parse_summary(run_example(tmp_path, "--tiny", "tiny-policy", "--max_steps", "16"))
    assert head == {"steps": 16, "iterations": 8, "learning_rate": 1e-2}  # two passes per generated batch
    assert set(rows) == {"reward", "kl_old", "kl_coef", "rejected_frac"}
    assert set(rows["reward"]) == {"first", "last"}
    kl_old, kl_coef = rows["kl_old"], rows["kl_coef"]
    assert kl_old["target"] == 0.02
    # KLhat_old reached the band in which the controller keeps or raises its coefficient (> target / 1.5)
    assert kl_old["max"] > kl_old["target"] / 1.5
    assert kl_old["last"] > 0
    assert kl_coef["first"] == 0.5 and kl_coef["last"] != kl_coef["first"]
    assert kl_coef["raised"] + kl_coef["lowered"] >= 1
    assert 0 <= rows["rejected_frac"]["max"] <= 1
    assert os.path.isfile(tmp_path / "tiny-policy" / "config.json")  # --tiny wrote the model it trained


def test_a_reward_model_in_place_of_the_function(tmp_path):
    """--reward_model: a sequence-classification model with one label, a folder here (a hub id in use)."""
    from transformers import Qwen2ForSequenceClassification

    tokenizer = tiny_tokenizer()
    config = tiny_model(tokenizer).config
    config.num_labels = 1
    Qwen2ForSequenceClassification(config).save_pretrained(tmp_path / "reward")
    tokenizer.save_pretrained(tmp_path / "reward")
    args = ("--tiny", "tiny-policy", "--reward_model", "reward", "--max_steps", "2")
    head, rows = parse_summary(run_example(tmp_path, *args))
    assert head["steps"] == 2 and head["iterations"] == 1
    assert rows["kl_old"]["max"] > 0


@pytest.mark.parametrize("given", [(), ("--model", "m", "--tiny", "t")])
def test_one_of_model_or_tiny(tmp_path, given):
    proc = subprocess.run(
        [sys.executable, SCRIPT, *given], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "give one of --model or --tiny" in proc.stderr


def test_quickstart_quotes_the_file():
    """Each Python block of the Quickstart's "Your own model" section is a verbatim excerpt of the script."""
    text = open(os.path.join(ROOT, "docs", "quickstart.md")).read()
    section = text.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "the Quickstart's own-model section quotes no code"
    script = open(SCRIPT).read()
    for block in blocks:
        assert block in script, "the Quickstart's excerpt differs from examples/own_model.py:\n" + block
