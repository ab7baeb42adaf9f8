"""The model card `RGPOTrainer` and `AsyncRGPOTrainer` write (``README.md`` in ``output_dir``, at every
checkpoint and on request).

TRL's card (``trl/templates/lm_model_card.md``) assumes hub names: for a run on a local model and a local
dataset it titles the card "Model Card for None", links ``huggingface.co/None`` and
``huggingface.co/datasets/<local path>``, loads ``pipeline(model="None")`` and says nothing about the
training. This card has TRL's sections and metadata, links to the hub only what `hub_id` recognises as a hub
name (a local model or dataset is named, never linked), falls back to the output directory's name, and its
"Training procedure" lists the RGPO settings the run used.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id
from transformers import is_wandb_available
from trl.trainer.utils import get_comet_experiment_url, get_config_model_id, get_trackio_space_url

HUB = "https://huggingface.co"
RATIO_MODE_WORDS = {
    "old": "π/π_old, the ratio to the policy that sampled the batch",
    "ref": "π/π_ref, the ratio to the frozen reference",
    "dual": "max(π/π_old, π/π_ref) per token",
}
QUESTION = (  # TRL's card's example prompt
    "If you had a time machine, but could only go to the past or the future once and never return, which "
    "would you choose and why?"
)
# TRL's citation, as TRL's own card asks for it
TRL_CITATION = """@software{vonwerra2020trl,
  title   = {{TRL: Transformers Reinforcement Learning}},
  author  = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
  license = {Apache-2.0},
  url     = {https://github.com/huggingface/trl},
  year    = {2020}
}"""  # noqa: E501


def hub_id(name: str | None) -> str | None:
    """``name`` when it can only be a hub repository id; None for no name or a local path (one that exists
    here, or one no repository id could spell, such as an absolute path), so nothing local gets a hub link."""
    if not name or os.path.exists(name):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def _named(what: str, name: str | None) -> str:
    """A markdown mention of a model or dataset: a hub link for a hub id, the local name otherwise."""
    repo = hub_id(name)
    if repo is not None:
        link = f"{HUB}/datasets/{repo}" if what == "dataset" else f"{HUB}/{repo}"
        return f"[{repo}]({link})"
    return f"the local {what} `{Path(name).name or name}`"


def loss_settings(trainer, behaviour: str, updated: str) -> list[str]:
    """The RGPO loss's settings as both trainers name them: the gate, the ratio it sees, the KL to
    ``behaviour`` (the policy that sampled) with its controller, updated ``updated``, and the KL to the
    reference."""
    args, state = trainer.args, trainer.state
    gate_params = ", ".join(f"{k}={v:g}" for k, v in trainer.gate.param_values.items())
    lines = [
        f"gate: `{args.gate}`" + (f" ({gate_params})" if gate_params else ""),
        f"ratio mode: `{args.ratio_mode}` (the gate sees {RATIO_MODE_WORDS[args.ratio_mode]})",
    ]
    if args.kl_controller == "fixed":
        kl_old = f"`fixed` coefficient {args.kl_coef:g}"
    else:
        kl_old = (
            f"`{args.kl_controller}` controller from kl_coef {args.kl_coef:g}, target kl_target "
            f"{args.kl_target:g}, bounds [{args.kl_coef_min:g}, {args.kl_coef_max:g}], updated {updated}; "
            f"{trainer.kl_ctl.kl_coef:g} at step {state.global_step}"
        )
    lines.append(f"KL to {behaviour} (r_old - 1 - log r_old): {kl_old}")
    bias = ", times the ratio to π_old" if getattr(args, "use_bias_correction_kl", False) else ""
    lines.append(f"KL to the reference (k3{bias}): beta (β_ref) {args.beta:g}")
    return lines


def optimisation_settings(trainer, reuse: str) -> list[str]:
    """Learning rate, steps, sampling (``reuse``: how often a sample is trained on) and batch, as both
    trainers name them."""
    args, state = trainer.args, trainer.state
    planned = f"max_steps {args.max_steps}" if args.max_steps > 0 else f"{args.num_train_epochs:g} epochs"
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)  # an enum or its name
    return [
        f"learning rate {args.learning_rate:g} (`{schedule}` schedule, warmup_steps {args.warmup_steps:g})",
        f"optimizer steps: {state.global_step} trained ({planned})",
        f"{args.num_generations} completions per prompt, up to {args.max_completion_length} tokens, "
        f"temperature {args.temperature:g}; {reuse}",
        f"batch: {args.per_device_train_batch_size} completions per device x "
        f"{args.gradient_accumulation_steps} accumulation steps x {trainer.accelerator.num_processes} "
        f"processes; seed {args.seed}",
    ]


def training_settings(trainer) -> list[str]:
    """The settings of an `RGPOTrainer`'s run as markdown list items: the RGPO loss (gate, ratio mode, both KL
    terms), GRPO's options it uses, and the optimisation (learning rate, steps, batch)."""
    args, state = trainer.args, trainer.state
    lines = loss_settings(trainer, "π_old", "once per iteration")
    lines.append(
        f"loss aggregation `{args.loss_type}`, importance sampling level `{args.importance_sampling_level}`"
    )
    if trainer.use_adaptive_entropy:
        lines.append(
            f"entropy bonus: adaptive from entropy_coef {args.entropy_coef:g}, target "
            f"{args.entropy_target:g}, step {args.entropy_coef_delta:g}, bounds [{args.entropy_coef_min:g}, "
            f"{args.entropy_coef_max:g}]; {trainer.entropy_coef:g} at step {state.global_step}"
        )
    elif args.entropy_coef != 0.0:
        lines.append(f"entropy bonus: entropy_coef {args.entropy_coef:g}")
    reuse = f"num_iterations {args.num_iterations} (passes over each generation batch)"
    return [f"- {line}" for line in [*lines, *optimisation_settings(trainer, reuse)]]


def build_model_card(
    trainer,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: str | list[str] | None = None,
    settings: list[str] | None = None,
) -> ModelCard:
    """The card for the model of ``trainer``, an `RGPOTrainer` or `AsyncRGPOTrainer` (untyped, like
    `loss_settings`'s: both trainers import this module, which imports neither), with the arguments
    `trl.GRPOTrainer.create_model_card` takes; ``settings``: its "Training procedure" list, default
    `training_settings` (RGPOTrainer's)."""
    args = trainer.args
    output_name = Path(args.output_dir).resolve().name
    hub_model_id = trainer.hub_model_id  # set once the run has a hub repository (push_to_hub)
    if not model_name:
        model_name = (hub_model_id or args.hub_model_id or "").split("/")[-1] or output_name
    base_model = get_config_model_id(trainer.model.config) or None
    dataset = hub_id(dataset_name)

    tags = {tags} if isinstance(tags, str) else set(tags or ())
    tags.update(trainer._tag_names)
    if hasattr(trainer.model.config, "unsloth_version"):
        tags.add("unsloth")
    if "JOB_ID" in os.environ:
        tags.add("hf_jobs")
    trackio_url = get_trackio_space_url()
    if trackio_url is not None:
        tags = {t for t in tags if not t.startswith("trackio:")} | {f"trackio:{trackio_url}"}
    card_data = ModelCardData(
        base_model=hub_id(base_model),
        datasets=dataset,
        library_name="transformers",
        model_name=model_name,
        tags=["generated_from_trainer", *sorted(tags)],
    )

    origin = "This model was fine-tuned"  # from a model built in memory: no name to give
    if base_model:
        origin = f"This model is a fine-tuned version of {_named('model', base_model)}"
    if dataset_name:
        origin += f" on {_named('dataset', dataset_name)}" + (" dataset" if dataset else "")
    where = hub_model_id or args.output_dir
    where_note = "" if hub_model_id else "  # the local output directory; its hub id once pushed"
    badges = []
    if is_wandb_available():
        import wandb

        if wandb.run is not None:
            badges.append(f"[Weights & Biases run]({wandb.run.url})")
    if trackio_url is not None:
        badges.append(f"[Trackio run]({trackio_url})")
    comet_url = get_comet_experiment_url()
    if comet_url is not None:
        badges.append(f"[Comet experiment]({comet_url})")
    paper = trainer._paper
    versions = {
        "TRL": "trl",
        "Transformers": "transformers",
        "Pytorch": "torch",
        "Datasets": "datasets",
        "Tokenizers": "tokenizers",
        "rgpo-trl": "rgpo-trl",
    }
    body = "\n".join(
        [
            f"# Model Card for {model_name}",
            "",
            f"{origin}.",
            "It has been trained using [TRL](https://github.com/huggingface/trl) and "
            f"rgpo-trl's `{type(trainer).__name__}`.",
            "",
            "## Quick start",
            "",
            "```python",
            "from transformers import pipeline",
            "",
            f'question = "{QUESTION}"',
            f'generator = pipeline("text-generation", model="{where}", device_map="auto"){where_note}',
            'output = generator([{"role": "user", "content": question}], max_new_tokens=128, '
            "return_full_text=False)[0]",
            'print(output["generated_text"])',
            "```",
            "",
            "## Training procedure",
            "",
            *([" · ".join(badges), ""] if badges else []),
            f"This model was trained with {trainer._name}, the method of *{paper['title']}*, with these "
            "settings:",
            "",
            *(training_settings(trainer) if settings is None else settings),
            "",
            "### Framework versions",
            "",
            *(f"- {label}: {_version(package)}" for label, package in versions.items()),
            "",
            "## Citations",
            "",
            f"Cite {trainer._name} as:",
            "",
            "```bibtex",
            paper["citation"],
            "```",
            "",
            "Cite TRL as:",
            "",
            "```bibtex",
            TRL_CITATION,
            "```",
            "",
        ]
    )
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n{body}")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:  # e.g. rgpo-trl run from a checkout without installing it
        return "not installed"
