"""examples/own_model.py, the "your own model" script of the README and the Quickstart, runs as written on the
tiny offline model (the code that trains a hub model), and its closing summary shows RGPO's trust region at
work: KLhat_old reached the target's band and the controller moved the KL-to-old coefficient. Without a GPU it
picks the CPU and float32 and says so; a user's prompts file and reward function reach the trainer; a bad
input ends in one line. The Quickstart's excerpt of it is the file's own text."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from rgpo_trl.testing import tiny_model, tiny_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "own_model.py")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# no GPU visible, as on a laptop: the script must pick the CPU by itself
ENV = {**OFFLINE, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": ROOT, "CUDA_VISIBLE_DEVICES": ""}
NO_GPU_LINE = "No GPU found: training on the CPU in float32."


def run_script(cwd, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **ENV}
    return subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def run_example(cwd, *args: str) -> str:
    proc = run_script(cwd, "--output_dir", "out", *args)
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
    stdout = run_example(tmp_path, "--tiny", "tiny-policy", "--max_steps", "16")  # no --cpu: none is needed
    assert NO_GPU_LINE in stdout.splitlines()
    head, rows = parse_summary(stdout)
    assert head == {"steps": 16, "iterations": 8, "learning_rate": 1e-2}  # two passes per generated batch
    assert set(rows) == {"reward", "kl_old", "kl_coef", "rejected_frac"}
    assert set(rows["reward"]) == {"first", "last"}
    kl_old, kl_coef = rows["kl_old"], rows["kl_coef"]
    assert kl_old["target"] == 0.02
    # KLhat_old reached the band in which the controller keeps or raises its coefficient (> target / 1.5)
    assert kl_old["max"] > kl_old["target"] / 1.5
    assert kl_old["last"] > 0
    assert kl_coef["first"] == 0.5
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
    args = ("--cpu", "--tiny", "tiny-policy", "--reward_model", "reward", "--max_steps", "2")
    stdout = run_example(tmp_path, *args)
    assert NO_GPU_LINE not in stdout  # asked for: nothing to say
    head, rows = parse_summary(stdout)
    assert head["steps"] == 2 and head["iterations"] == 1
    assert rows["kl_old"]["max"] > 0


RECORDING_REWARD = """
import json


def score(prompts, completions, **kwargs):
    with open("seen.jsonl", "a") as f:
        topics = kwargs.get("topic") or [None] * len(prompts)
        for prompt, completion, topic in zip(prompts, completions, topics):
            f.write(json.dumps({"prompt": prompt, "topic": topic, "completion": completion}) + "\\n")
    return [text.count("e") / max(len(text), 1) for text in completions]
"""
PROMPTS = {
    f"{word} {letter}?": word.split()[0] for word in ("tell me", "what is", "why", "how") for letter in "xyz"
}


@pytest.mark.parametrize("kind", ["jsonl", "txt"])
def test_own_prompts_file_and_reward_function_without_editing(tmp_path, kind):
    """--prompts and --reward from the user's own folder: the reward function of my_rewards.py sees exactly
    the file's prompts (and, from a .jsonl file, their other fields as keyword arguments)."""
    (tmp_path / "my_rewards.py").write_text(RECORDING_REWARD)
    if kind == "jsonl":
        lines = [json.dumps({"prompt": p, "topic": t}) for p, t in PROMPTS.items()]
    else:
        lines = list(PROMPTS)
    (tmp_path / f"prompts.{kind}").write_text("\n".join(["", *lines, ""]))  # blank lines are skipped
    args = ("--tiny", "tiny-policy", "--prompts", f"prompts.{kind}", "--reward", "my_rewards:score")
    head, rows = parse_summary(run_example(tmp_path, *args, "--max_steps", "4"))
    assert head["steps"] == 4 and head["iterations"] == 2
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert len(seen) == 2 * 8  # two generated batches of 8 completions
    for record in seen:
        assert record["prompt"] in PROMPTS
        assert record["topic"] == (PROMPTS[record["prompt"]] if kind == "jsonl" else None)
    scores = [r["completion"].count("e") / max(len(r["completion"]), 1) for r in seen]
    assert rows["reward"]["first"] == pytest.approx(
        sum(scores[:8]) / 8, abs=1e-4
    )  # the user's reward trained


@pytest.mark.parametrize(
    "setup,args,needle",
    [
        (
            lambda d: (d / "empty").mkdir(),
            ["--model", "empty"],
            "--model empty: the folder lacks config.json, ",
        ),
        (lambda d: None, ["--model", "./nope"], "--model ./nope: no such folder"),
        (lambda d: None, ["--tiny", "t", "--prompts", "none.txt"], "--prompts none.txt: cannot read it"),
        (lambda d: (d / "e.txt").write_text("\n\n"), ["--tiny", "t", "--prompts", "e.txt"], "has no prompts"),
        (
            lambda d: (d / "p.jsonl").write_text('{"prompt": "a"}\n{"text": "b"}\n'),
            ["--tiny", "t", "--prompts", "p.jsonl"],
            '--prompts p.jsonl, line 2: no "prompt" field',
        ),
        (lambda d: None, ["--tiny", "t", "--reward", "my_rewards"], "expected module:function"),
        (lambda d: None, ["--tiny", "t", "--reward", "nomodule:f"], "cannot import nomodule"),
        (
            lambda d: (d / "r.py").write_text("x = 1\n"),
            ["--tiny", "t", "--reward", "r:score"],
            "--reward r:score: r has no function score",
        ),
    ],
    ids=[
        "empty_folder",
        "no_folder",
        "no_prompts_file",
        "empty_prompts",
        "jsonl_no_prompt",
        "reward_spec",
        "reward_module",
        "reward_function",
    ],
)
def test_bad_input_is_one_line(tmp_path, setup, args, needle):
    setup(tmp_path)
    proc = run_script(tmp_path, *args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and not (tmp_path / "t").exists()


def test_help_shows_prompts_and_reward(tmp_path):
    proc = run_script(tmp_path, "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for needle in ("--prompts FILE", ".jsonl", "--reward MODULE:FUNCTION", "my_rewards:score", "--cpu"):
        assert needle in text, needle


@pytest.mark.parametrize("given", [(), ("--model", "m", "--tiny", "t")])
def test_one_of_model_or_tiny(tmp_path, given):
    proc = subprocess.run(
        [sys.executable, SCRIPT, *given], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "give one of --model or --tiny" in proc.stderr


def test_quickstart_quotes_the_file():
    """Each Python block of the Quickstart's "Your own model" section marked as an excerpt of the script is a
    verbatim excerpt (the user's own reward there is not one)."""
    text = open(os.path.join(ROOT, "docs", "quickstart.md")).read()
    section = text.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    marker = r"<!-- docs-test: skip \(an excerpt of examples/own_model.py[^)]*\) -->\n"
    blocks = re.findall(marker + r"```python\n(.*?)```", section, re.S)
    assert blocks, "the Quickstart's own-model section quotes no code"
    script = open(SCRIPT).read()
    for block in blocks:
        assert block in script, "the Quickstart's excerpt differs from examples/own_model.py:\n" + block
