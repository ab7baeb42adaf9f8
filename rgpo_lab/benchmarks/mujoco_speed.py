"""Speed benchmark: our PPO / RGPO scripts vs CleanRL's ppo_continuous_action.py, same machine, one run.

    python -m rgpo_lab.benchmarks.mujoco_speed --cleanrl-path /path/to/cleanrl [--env-id Hopper-v4]

Ours is the lab runner (`rgpo_lab.mujoco_runner`, the scripts before issue 48): "our scripts" and "the
scripts" below mean it, not the single-file scripts in mujoco_baselines/.

``--cleanrl-path`` is a local checkout of https://github.com/vwxyzjn/cleanrl (or the path of its
``cleanrl/ppo_continuous_action.py``); the PyPI ``cleanrl`` wheel does not install on Python 3.11.
The file is copied to a temporary directory and only the gymnasium-1.x compatibility fixes listed
in the output are applied; nothing of it is stored in this repository.

Two measurements, both interleaved so that machine load hits every variant alike:

1. End-to-end SPS (subprocesses, OMP_NUM_THREADS=1 for all): CleanRL, ours at CleanRL's width 64
   (PPO and RGPO) and ours at the paper's width 256, in rotating order for ``--rounds`` rounds,
   with identical hyperparameters (1 env, 2048 steps/rollout, 32 mini-batches of 64, 10 epochs,
   lr 3e-4 annealed, GAE 0.95, gamma 0.99, clip 0.2, obs/reward normalisation, TensorBoard on).
   SPS is each script's own global_step / (time since its training loop started).
2. Update cost, RGPO vs PPO (in-process): the scripts' own policy-loss and per-epoch stats functions
   on identical data and networks, full mini-batch steps (forward, loss, backward, grad-norm clip,
   Adam), PPO / RGPO / a second PPO (A/A control, shows the noise floor) interleaved step by step;
   median of per-epoch time ratios with a bootstrap 95% interval. The end-to-end runs also report
   the median per-iteration ``update_time`` of each script.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

from rgpo_lab.benchmarks.common import ONE_THREAD, RESULTS, ROOT, invocation
from rgpo_lab.results_data import open_metrics

# (description, old, new): each must match exactly once in CleanRL's file.
CLEANRL_PATCHES = [
    (
        "gymnasium>=1.0: TransformObservation needs the observation space",
        "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))",
        "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)",
    ),
    (
        "gymnasium>=1.0: SAME_STEP autoreset (the default NEXT_STEP inserts a fake transition after each "
        "episode)",
        "for i in range(args.num_envs)]\n    )",
        "for i in range(args.num_envs)],\n        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,\n    )",
    ),
    (
        "gymnasium>=1.0: final_info is a batched dict with an `_episode` mask",
        """            if "final_info" in infos:
                for info in infos["final_info"]:
                    if info and "episode" in info:
                        print(f"global_step={global_step}, episodic_return={info['episode']['r']}")
                        writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)
                        writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)
""",
        """            if "final_info" in infos and "episode" in infos["final_info"]:
                _fi = infos["final_info"]
                for _i in np.flatnonzero(_fi["_episode"]):
                    print(f"global_step={global_step}, episodic_return={_fi['episode']['r'][_i]}")
                    writer.add_scalar("charts/episodic_return", _fi["episode"]["r"][_i], global_step)
                    writer.add_scalar("charts/episodic_length", _fi["episode"]["l"][_i], global_step)
""",
    ),
]


def patch_cleanrl(src: str) -> str:
    for desc, old, new in CLEANRL_PATCHES:
        if src.count(old) != 1:
            raise SystemExit(f"CleanRL file does not match the expected version (patch: {desc!r})")
        src = src.replace(old, new)
    return src


def find_cleanrl_file(path: str) -> str:
    for cand in (
        path,
        os.path.join(path, "cleanrl", "ppo_continuous_action.py"),
        os.path.join(path, "ppo_continuous_action.py"),
    ):
        if os.path.isfile(cand):
            return cand
    raise SystemExit(f"no ppo_continuous_action.py under {path!r}")


def run(cmd, cwd, env):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout, wall


def e2e(args, tmp):
    # eager runs only: ONE_THREAD's inductor setting is inert here
    env = {**os.environ, **ONE_THREAD, "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cleanrl_dir = os.path.join(tmp, "cleanrl")
    os.makedirs(cleanrl_dir)
    with open(find_cleanrl_file(args.cleanrl_path)) as f:
        patched = patch_cleanrl(f.read())
    with open(os.path.join(cleanrl_dir, "ppo_continuous_action.py"), "w") as f:
        f.write(patched)
    common = ["--env-id", args.env_id, "--total-timesteps", str(args.total_timesteps), "--seed", "1"]
    common += ["--num-steps", "2048", "--update-epochs", "10"]
    variants = {
        "cleanrl_ppo_64": (
            [sys.executable, "ppo_continuous_action.py", *common, "--num-minibatches", "32", "--no-cuda"],
            cleanrl_dir,
        ),
    }
    for method in ("ppo", "rgpo"):
        for width in (64, 256):
            name = f"ours_{method}_{width}"
            argv = [sys.executable, "-m", "rgpo_lab.mujoco_runner", method, *common]  # the lab runner, eager
            argv += ["--minibatch-size", "64", "--hidden-size", str(width)]
            argv += ["--output-dir", os.path.join(tmp, "runs"), "--no-verbose"]
            variants[name] = (argv, tmp)
    # A/A control: the same PPO run again in every round; its ratio to ours_ppo_64 shows how much two
    # identical runs differ on this machine (the noise floor of the end-to-end ratios)
    variants["ours_ppo_64_control"] = variants["ours_ppo_64"]
    names = list(variants)
    results = {
        n: {"sps": [], "wall": [], "update_time": [], "rollout_time": [], "run_update_time": []}
        for n in names
    }
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            cmd, cwd = variants[name]
            if name.startswith("ours"):
                cmd = [*cmd, "--run-name", f"{name}_{rnd}"]
            out, wall = run(cmd, cwd, env)
            results[name]["wall"].append(wall)
            if name.startswith("cleanrl"):
                sps = float(re.findall(r"SPS: (\d+)", out)[-1])
            else:
                run_dir = os.path.join(tmp, "runs", f"{name}_{rnd}")
                sps = json.load(open(os.path.join(run_dir, "final.json")))["SPS"]
                import csv

                with open_metrics(run_dir, required=True) as f:
                    rows = list(csv.DictReader(f))
                results[name]["update_time"] += [float(r["update_time"]) for r in rows]
                results[name]["rollout_time"] += [float(r["rollout_time"]) for r in rows]
                results[name]["run_update_time"].append(
                    statistics.median(float(r["update_time"]) for r in rows)
                )
            results[name]["sps"].append(sps)
            print(f"round {rnd} {name:16s} SPS {sps:7.1f}  wall {wall:6.1f}s", flush=True)
    return results, [d for d, _, _ in CLEANRL_PATCHES], variants


def update_microbench(args):
    """Alternating blocks of full PPO / RGPO mini-batch steps on identical data and networks."""
    import torch

    from rgpo_lab.mujoco_runner import ppo_continuous_action as ppo_mod
    from rgpo_lab.mujoco_runner import rgpo_continuous_action as rgpo_mod

    torch.set_num_threads(1)
    out = {}
    for width in (64, 256):
        out[width] = _microbench_width(width, ppo_mod, rgpo_mod, args.micro_blocks)
    out["loss_only"] = _microbench_loss(ppo_mod, rgpo_mod, args.micro_blocks)
    return out


def _microbench_loss(ppo_mod, rgpo_mod, blocks, calls=200):
    """Policy loss alone (forward + backward on 64 log-probs), interleaved: the scripts' PPO and RGPO
    losses, and ``rgpo_loss`` with its per-call diagnostics (what the TRL trainer uses; the scripts
    reduce the diagnostics once per epoch instead)."""
    import torch

    import rgpo_trl

    torch.manual_seed(0)
    x = torch.randn(64, requires_grad=True)
    old, adv = torch.randn(64) * 0.01, torch.randn(64)
    gate = rgpo_trl.make_gate("sigmoid", k=5.0)

    def ppo():
        ppo_mod.ppo_policy_loss(x * 0.1, old, adv, 0.2).backward()

    def rgpo():
        rgpo_mod.rgpo_policy_loss(x * 0.1, old, adv, gate, 0.5).backward()

    def rgpo_with_diagnostics():
        loss, diag = rgpo_trl.rgpo_loss(x * 0.1, old, adv, gate, kl_coef=0.5)
        loss.backward()

    fns = {"ppo": ppo, "rgpo": rgpo, "rgpo_with_diagnostics": rgpo_with_diagnostics}
    times = {k: [] for k in fns}
    names = list(fns)
    for block in range(blocks):
        k = block % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            times[name].append((time.perf_counter() - t0) / calls)
    res = {f"{k}_us_median": statistics.median(v) * 1e6 for k, v in times.items()}
    res["rgpo_over_ppo"] = res["rgpo_us_median"] / res["ppo_us_median"]
    res["rgpo_with_diagnostics_over_ppo"] = res["rgpo_with_diagnostics_us_median"] / res["ppo_us_median"]
    print(f"loss-only microbench: {res}", flush=True)
    return res


def _microbench_width(width, ppo_mod, rgpo_mod, blocks, update_epochs=10):
    """Full mini-batch update steps of PPO, RGPO and a second PPO (the A/A control), interleaved.

    Every ``update_epochs`` blocks the old log-probs are refreshed from each variant's current policy,
    as a new rollout would (without it the policy drifts arbitrarily far from pi_old, which no
    training run does), and the networks are re-allocated (see ``new_rollout``). Every step, the
    three variants take turns on the same mini-batch indices in rotating order, so load drift on a
    shared machine hits all alike. A block is one epoch (32 steps per variant); the
    statistic is the median over blocks of the per-block time ratio to PPO, with a bootstrap 95%
    interval. The control runs PPO's loss on its own network copy and optimiser: its ratio (ideally
    1.000) shows the measurement's bias and noise floor."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    obs_dim, act_dim, T, mb = 11, 3, 2048, 64
    obs, actions = torch.randn(T, obs_dim), torch.randn(T, act_dim)
    adv, ret = torch.randn(T), torch.randn(T)
    pa, ra = ppo_mod.Args(hidden_size=width), rgpo_mod.Args(hidden_size=width)
    agents = {
        "ppo": ppo_mod.Agent(obs_dim, act_dim, pa),
        "rgpo": rgpo_mod.Agent(obs_dim, act_dim, ra),
        "ppo_control": ppo_mod.Agent(obs_dim, act_dim, pa),
    }
    for name in ("rgpo", "ppo_control"):
        agents[name].load_state_dict(agents["ppo"].state_dict())
    old = {}

    opts = {k: torch.optim.Adam(a.parameters(), lr=3e-4, eps=1e-5) for k, a in agents.items()}
    shuffle = random.Random(0).shuffle

    def new_rollout():
        """Behaviour policy := current policy, per variant (as after a new rollout). Networks and
        optimiser states are also re-allocated, in random order: where a variant's tensors sit in
        memory shifts its step time by ~1%, and re-placing them averages that out."""
        order = list(agents)
        shuffle(order)
        for name in order:
            agents[name] = copy.deepcopy(agents[name])
            state = copy.deepcopy(opts[name].state_dict())
            opts[name] = torch.optim.Adam(agents[name].parameters(), lr=3e-4, eps=1e-5)
            opts[name].load_state_dict(state)
        with torch.no_grad():
            for name, agent in agents.items():
                old[name] = agent.log_prob(agent.actor_mean(obs), actions), agent.critic(obs).squeeze(-1)

    import rgpo_trl

    gate = rgpo_trl.make_gate(ra.gate, **ra.gate_params)
    kl_ctl = rgpo_trl.make_kl_controller(
        ra.kl_controller,
        kl_coef=ra.kl_coef,
        kl_target=ra.kl_target,
        kl_coef_min=ra.kl_coef_min,
        kl_coef_max=ra.kl_coef_max,
    )
    policy_losses = {
        "ppo": lambda newlp, oldlp, a: ppo_mod.ppo_policy_loss(newlp, oldlp, a, 0.2),
        "rgpo": lambda newlp, oldlp, a: rgpo_mod.rgpo_policy_loss(newlp, oldlp, a, gate, kl_ctl.kl_coef),
    }
    epoch_stats = {
        "ppo": lambda newlps, oldlps: ppo_mod.ppo_epoch_stats(newlps, oldlps, 0.2),
        "rgpo": lambda newlps, oldlps: rgpo_mod.rgpo_epoch_stats(newlps, oldlps, gate),
    }
    policy_losses["ppo_control"], epoch_stats["ppo_control"] = policy_losses["ppo"], epoch_stats["ppo"]
    kept = {}  # per variant: (log-probs, indices) of the epoch's steps, for the per-epoch stats

    def step(name, idx):  # the scripts' update step (value clipping, grad-variance stats, clip, Adam)
        agent = agents[name]
        mb_obs = obs[idx]
        newlp = agent.log_prob(agent.actor_mean(mb_obs), actions[idx])
        newv = agent.critic(mb_obs).squeeze(-1)
        a = adv[idx]
        a = (a - a.mean()) / (a.std() + 1e-8)
        oldlp, vals = old[name]
        pg = policy_losses[name](newlp, oldlp[idx], a)
        mv, mr = vals[idx], ret[idx]
        vc = mv + (newv - mv).clamp(-0.2, 0.2)
        vl = 0.5 * torch.max((newv - mr) ** 2, (vc - mr) ** 2).mean()
        loss = pg - 0.0 * agent.entropy() + 0.5 * vl
        if not torch.isfinite(loss):
            raise RuntimeError("non-finite")
        opts[name].zero_grad(set_to_none=True)
        loss.backward()
        g = torch.cat([p.grad.reshape(-1) for p in agent.policy_parameters()])
        float(g.dot(g))
        nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        opts[name].step()
        kept[name][0].append(newlp.detach())
        kept[name][1].append(idx)

    def end_of_epoch(name):  # the scripts' per-epoch stats reduction
        lps, idxs = kept[name]
        epoch_stats[name](torch.stack(lps), old[name][0][torch.stack(idxs)])

    names = list(agents)
    times = {n: [] for n in names}
    for block in range(blocks + 2):  # the first two blocks are warm-up
        if block % update_epochs == 0:
            new_rollout()
        perm = torch.randperm(T)
        block_t = dict.fromkeys(names, 0.0)
        kept.update({n: ([], []) for n in names})
        for i, start in enumerate(range(0, T, mb)):
            idx = perm[start : start + mb]
            k = (i + block) % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                step(name, idx)
                block_t[name] += time.perf_counter() - t0
        for name in names[block % len(names) :] + names[: block % len(names)]:
            t0 = time.perf_counter()
            end_of_epoch(name)
            block_t[name] += time.perf_counter() - t0
        if block >= 2:
            for name, t in block_t.items():
                times[name].append(t)
    res = {f"{n}_epoch_s_median": statistics.median(times[n]) for n in names}
    res["blocks"] = blocks
    msg = [f"update microbench width {width}: PPO epoch {res['ppo_epoch_s_median'] * 1e3:.1f} ms"]
    for name in ("rgpo", "ppo_control"):
        ratios = [x / p for x, p in zip(times[name], times["ppo"], strict=True)]
        lo, hi = bootstrap_median_ci(ratios)
        res[f"{name}_over_ppo"] = statistics.median(ratios)
        res[f"{name}_over_ppo_ci95"] = [lo, hi]
        msg.append(f"{name}/PPO {res[f'{name}_over_ppo']:.3f} [95% CI {lo:.3f}, {hi:.3f}]")
    print(", ".join(msg), flush=True)
    return res


def bootstrap_median_ci(values, n_boot=4000, seed=0):
    """Percentile-bootstrap 95% interval of the median of ``values``."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n_boot))
    return meds[int(0.025 * n_boot)], meds[int(0.975 * n_boot) - 1]


def main():
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.mujoco_speed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cleanrl-path", required=True, help="local checkout of vwxyzjn/cleanrl (or the file)")
    p.add_argument("--env-id", default="Hopper-v4")
    p.add_argument("--total-timesteps", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--micro-blocks", type=int, default=20)
    p.add_argument("--out", default=os.path.join(RESULTS, "mujoco_speed"))
    p.add_argument("--skip-e2e", action="store_true")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        micro = update_microbench(args)
        if args.skip_e2e:
            e2e_res, patches = {}, []
        else:
            e2e_res, patches, _ = e2e(args, tmp)

    med = {n: {k: (statistics.median(v) if v else None) for k, v in r.items()} for n, r in e2e_res.items()}
    # ratios are paired within a round (the variants of one round ran back to back), then the median
    # over rounds is taken: the machine load drifts between rounds much more than within one
    ratios, per_round = {}, {}
    if med:
        c = e2e_res["cleanrl_ppo_64"]["sps"]
        for n in med:
            per_round[f"{n}_sps_over_cleanrl"] = [x / y for x, y in zip(e2e_res[n]["sps"], c, strict=True)]
        for w in (64, 256):
            rg, pp = e2e_res[f"ours_rgpo_{w}"]["run_update_time"], e2e_res[f"ours_ppo_{w}"]["run_update_time"]
            per_round[f"rgpo_over_ppo_update_time_{w}"] = [x / y for x, y in zip(rg, pp, strict=True)]
        aa, pp = e2e_res["ours_ppo_64_control"]["run_update_time"], e2e_res["ours_ppo_64"]["run_update_time"]
        per_round["ppo_control_over_ppo_update_time_64"] = [x / y for x, y in zip(aa, pp, strict=True)]
        ratios = {k: statistics.median(v) for k, v in per_round.items()}
    command = invocation("mujoco_speed")
    result = {
        "command": command.replace(args.cleanrl_path, "<cleanrl>"),
        "env_id": args.env_id,
        "total_timesteps": args.total_timesteps,
        "rounds": args.rounds,
        "cleanrl_patches": patches,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
        },
        "e2e_median": med,
        "e2e_all": e2e_res,
        "ratios": ratios,
        "ratios_per_round": per_round,
        "update_microbench": micro,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=2)
    lines = [
        "# MuJoCo speed benchmark",
        "",
        f"Command: `{result['command']}`  ",
        f"Env {args.env_id}, {args.total_timesteps} steps per run, {args.rounds} interleaved rounds, "
        f"OMP_NUM_THREADS=1; machine: {result['machine']['platform']}, {os.cpu_count()} CPUs "
        f"(load average at end {', '.join(f'{x:.1f}' for x in os.getloadavg())}).",
        "",
    ]
    if med:
        lines += [
            "| variant | SPS (median) | SPS / CleanRL (median of per-round ratios) | per round | rollout "
            "s/iter | update s/iter |",
            "|---|---|---|---|---|---|",
        ]
        for n, m in med.items():
            ro = f"{m['rollout_time']:.2f}" if m["rollout_time"] else "-"
            up = f"{m['update_time']:.2f}" if m["update_time"] else "-"
            pr = ", ".join(f"{x:.2f}" for x in per_round[f"{n}_sps_over_cleanrl"])
            lines.append(
                f"| {n} | {m['sps']:.0f} | {ratios[f'{n}_sps_over_cleanrl']:.2f}x | {pr} | {ro} | {up} |"
            )
        lines += [
            "",
            "RGPO/PPO per-iteration update time, end-to-end runs (median over rounds of the ratio of "
            "run medians):",
            "",
        ]
        for w in (64, 256):
            pr = ", ".join(f"{x:.2f}" for x in per_round[f"rgpo_over_ppo_update_time_{w}"])
            lines.append(f"- width {w}: {ratios[f'rgpo_over_ppo_update_time_{w}']:.3f} (per round: {pr})")
        pr = ", ".join(f"{x:.2f}" for x in per_round["ppo_control_over_ppo_update_time_64"])
        lines.append(
            f"- A/A control, PPO run twice, width 64: {ratios['ppo_control_over_ppo_update_time_64']:.3f} "
            f"(per round: {pr})"
        )
        lines.append("")
        lines += ["CleanRL fixes applied (gymnasium 1.x):", "", *[f"- {d}" for d in patches], ""]
    lines += [
        "RGPO/PPO update time, in-process microbenchmark: full mini-batch steps of PPO, RGPO and a second "
        "PPO (A/A control) interleaved step by step, one block = one epoch of 32 steps per variant plus its "
        "stats reduction; every 10 blocks the old log-probs are refreshed and the networks and optimisers "
        "re-allocated in random order (memory placement alone shifts a variant by ~1%); median over "
        f"{micro[64]['blocks']} blocks of the per-block time ratio, bootstrap 95% interval:",
        "",
        "| width | PPO epoch ms | RGPO / PPO | 95% CI | PPO control / PPO (A/A) | 95% CI |",
        "|---|---|---|---|---|---|",
    ]
    for w in (64, 256):
        m = micro[w]
        rc, cc = m["rgpo_over_ppo_ci95"], m["ppo_control_over_ppo_ci95"]
        lines.append(
            f"| {w} | {m['ppo_epoch_s_median'] * 1e3:.1f} | {m['rgpo_over_ppo']:.3f} | "
            f"{rc[0]:.3f}-{rc[1]:.3f} | {m['ppo_control_over_ppo']:.3f} | {cc[0]:.3f}-{cc[1]:.3f} |"
        )
    lo = micro["loss_only"]
    lines += [
        "",
        f"Policy loss alone (forward + backward, 64 samples), interleaved: PPO {lo['ppo_us_median']:.0f} us, "
        "the RGPO script's loss (`rgpo_trl.rgpo_loss`, diagnostics reduced per epoch) "
        f"{lo['rgpo_us_median']:.0f} us ({lo['rgpo_over_ppo']:.2f}x), `rgpo_loss` with per-call diagnostics "
        f"(the trainer's path) {lo['rgpo_with_diagnostics_us_median']:.0f} us "
        f"({lo['rgpo_with_diagnostics_over_ppo']:.2f}x).",
    ]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
