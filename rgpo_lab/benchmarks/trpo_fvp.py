"""TRPO's Fisher-vector products: rebuilding the KL gradient's graph per product, building it once, closed
form.

    python -m rgpo_lab.benchmarks.trpo_fvp --out results/benchmarks/trpo_fvp

It measures the lab runner (`rgpo_lab.mujoco_runner`, the scripts before issue 48): "the script" below means
its TRPO, not the single-file script in mujoco_baselines/.

The part of `trpo_step` that changed: 10 conjugate-gradient iterations plus the step-size product, on a
2048-state batch (Hopper-v4 shapes: 11 observations, 3 actions). Variants, in rotating order over `--rounds`
rounds in one process (median of the per-round time ratios to `rebuild`):

- `rebuild`: the script before (each product: forward, KL gradient with create_graph, a second backward);
- `rebuild2`: the same again (A/A: the noise floor of the ratios);
- `retained`: the script's `fisher_vector_product` (the KL gradient's graph built once, one backward per
  product; the default path);
- `closed_form`: the script's `gauss_newton_fvp` (J v and J^T u by hand through the activations at pi_old;
  --compile's path, other float rounding).

The step directions are compared with `rebuild`'s in every round (bit for bit, and the largest relative
difference of the step direction). The script's whole `trpo_step` (gradient, CG, line search) is timed in the
same rotation with either product, for scale.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from rgpo_lab.benchmarks.common import RESULTS, run_info, write_outputs

VARIANTS = ["rebuild", "rebuild2", "retained", "closed_form"]


def measure(width: int, rounds: int, n: int = 2048) -> dict:
    import torch

    from rgpo_lab.mujoco_runner import trpo_continuous_action as script

    torch.set_num_threads(1)
    torch.manual_seed(0)
    args = script.Args(hidden_size=width)
    agent = script.Agent(11, 3, args)
    obs, actions, adv = torch.randn(n, 11), torch.randn(n, 3), torch.randn(n)
    params = agent.policy_parameters()
    with torch.no_grad():
        old_mean, old_logstd = agent.actor_mean(obs), agent.actor_logstd.clone()
        oldlogprob = agent.log_prob(old_mean, actions)
    loss = script.trpo_policy_loss(agent.log_prob(agent.actor_mean(obs), actions), oldlogprob, adv)
    grad = script.flat(torch.autograd.grad(loss, params))

    def kl_fn():
        return script.gaussian_kl(old_mean, old_logstd, agent.actor_mean(obs), agent.actor_logstd).mean()

    def rebuilt(v):
        kl_grad = script.flat(torch.autograd.grad(kl_fn(), params, create_graph=True))
        return script.flat(torch.autograd.grad(kl_grad.dot(v), params)) + args.cg_damping * v

    def solve(variant):
        if variant.startswith("rebuild"):
            fvp = rebuilt
        elif variant == "retained":
            fvp = script.fisher_vector_product(agent, obs, kl_fn(), params, args.cg_damping)
        else:
            fvp = script.gauss_newton_fvp(agent, obs, None, params, args.cg_damping)
        step_dir = script.conjugate_gradient(fvp, -grad, args.cg_iters)
        return step_dir, step_dir.dot(fvp(step_dir))

    state = {k: t.clone() for k, t in agent.state_dict().items()}

    def whole_step(variant):
        closed_form = variant == "trpo_step_closed_form"
        make_fvp = script.gauss_newton_fvp if closed_form else script.fisher_vector_product
        out = script.trpo_step(agent, params, obs, actions, oldlogprob, adv, args, make_fvp=make_fvp)
        agent.load_state_dict(state)  # trpo_step moved the parameters: the products are taken at pi_old
        return out

    timed = [*VARIANTS, "trpo_step", "trpo_step_closed_form"]
    times: dict[str, list[float]] = {v: [] for v in timed}
    identical = dict.fromkeys(VARIANTS, True)
    max_rel = dict.fromkeys(VARIANTS, 0.0)
    for rnd in range(rounds):
        order = timed[rnd % len(timed) :] + timed[: rnd % len(timed)]
        out = {}
        for v in order:
            t0 = time.perf_counter()
            out[v] = whole_step(v) if v.startswith("trpo_step") else solve(v)
            times[v].append(time.perf_counter() - t0)
        for v in VARIANTS:
            identical[v] &= all(torch.equal(a, b) for a, b in zip(out["rebuild"], out[v], strict=True))
            ref, step_dir = out["rebuild"][0], out[v][0]
            max_rel[v] = max(max_rel[v], float((step_dir - ref).norm() / ref.norm()))
    return {
        "trpo_step_ms": statistics.median(times["trpo_step"]) * 1e3,
        "trpo_step_closed_form_ms": statistics.median(times["trpo_step_closed_form"]) * 1e3,
        "variants": {
            v: {
                "ms": statistics.median(times[v]) * 1e3,
                "speedup": statistics.median(a / b for a, b in zip(times["rebuild"], times[v], strict=True)),
                "speedup_vs_retained": statistics.median(
                    a / b for a, b in zip(times["retained"], times[v], strict=True)
                ),
                "bit_identical": identical[v],
                "max_rel_diff": max_rel[v],
            }
            for v in VARIANTS
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.trpo_fvp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default=os.path.join(RESULTS, "trpo_fvp"))
    a = p.parse_args()
    results = {w: measure(w, a.rounds) for w in a.widths}
    info = run_info("trpo_fvp", with_torch=True, rounds=a.rounds, results=results)
    lines = [
        "# TRPO: Fisher-vector products with the KL graph rebuilt per product, built once, or in closed form",
        "",
        f"Command: `{info['command']}`  ",
        f"Machine: {info['machine']}; one torch thread; load average at end "
        f"{', '.join(f'{x:.1f}' for x in info['load_average_at_end'])} (read the interleaved ratios; "
        "absolute times depend on the load). 2048 states, Hopper-v4 shapes, 10 CG iterations + the step-size "
        f"product; {a.rounds} rounds; speed-up = median of per-round time ratios. `retained` is the default "
        "path, `closed_form` --compile's; relative difference = largest ||d - d_rebuild|| / ||d_rebuild|| of "
        "the step direction d over the rounds.",
        "",
        "| width | variant | CG ms | speed-up vs rebuild | speed-up vs retained | step bit-identical to "
        "rebuild | relative difference |",
        "|---|---|---|---|---|---|---|",
    ]
    for w, r in results.items():
        for v, x in r["variants"].items():
            lines.append(
                f"| {w} | {v} | {x['ms']:.0f} | {x['speedup']:.2f}x | {x['speedup_vs_retained']:.2f}x | "
                f"{x['bit_identical']} | {x['max_rel_diff']:.1e} |"
            )
    lines += [
        "",
        "Whole `trpo_step` (gradient, CG, line search), ms: "
        + "; ".join(
            f"width {w}: {r['trpo_step_ms']:.0f} with `retained`, "
            f"{r['trpo_step_closed_form_ms']:.0f} with `closed_form`"
            for w, r in results.items()
        ),
    ]
    write_outputs(a.out, info, lines)


if __name__ == "__main__":
    main()
