"""`edgeroute train qos-card`: the QoS router's model card and learning curves, written
from the training runs' records (`models/qos/runs/*/training.json`) and the benchmark
results (`bench/results/qos.json`, `qos_live.json`), so that it states only what those
runs measured."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from edgeroute.qos.config import (
    QUALITIES,
    QUALITY_PROMPTS,
    RECORD,
    TrainConfig,
    latency_range,
    quality_flag,
    quality_suffix,
    rate_range,
    read_record,
    recorded_runs,
)
from edgeroute.qos.rebuild import compare, processor
from edgeroute.results_io import RESULTS, git, save_figure
from edgeroute.sim.edge import HELD_OUT_HARDWARE, TRAIN_HARDWARE, Fleet, load_tasks
from edgeroute.stats import crossed_interval, interval, interval_shown, verdict
from policies.predictor import MODEL_ROOT, predictor_dir

# The card's own code, and the rebuild check's, are not training code.
TRAINING_CODE = (
    "edgeroute/qos",
    ":(exclude)edgeroute/qos/card.py",
    ":(exclude)edgeroute/qos/rebuild.py",
    ":(exclude)edgeroute/qos/bound.py",  # a benchmark's reference, not used in training
    "edgeroute/sim/edge.py",
    "policies/qos_state.py",
)


def _json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _commit() -> str:
    """The last commit that changed the training code."""
    found = git("log", "-1", "--format=%h %s", "--", *TRAINING_CODE)
    return found[:100] if found else "unknown"


def runs_of(runs_dir: Path) -> dict[str, dict[str, Any]]:
    return {run.name: read_record(run) for run in recorded_runs(runs_dir)}


def plateau(history: list[dict[str, Any]], key: str = "qos") -> float | None:
    """Mean eval QoS (`key`: by argmax, or "qos_drawn" by draws) of the last third of
    the evaluations less that of the middle third: near 0 once the curve has flattened;
    None if the record lacks that curve (runs before it was measured)."""
    if any(h.get(key) is None for h in history):
        return None
    q = [h[key] for h in history]
    k = max(1, len(q) // 3)
    return statistics.fmean(q[-k:]) - statistics.fmean(q[-2 * k : -k] or q[:k])


def _commits(commits: Iterable[str]) -> str:
    return ", ".join(f"`{c}`" for c in sorted(set(commits)))


def trained_at(runs: dict[str, dict[str, Any]]) -> str:
    """Where the runs were trained, how their actors were exported, and for runs
    rebuilt since (records that name the commit they were first trained at) where."""
    rebuilt = {k: r for k, r in runs.items() if "first_trained_at" in r}
    first = (r.get("first_trained_at", r.get("commit", "unknown")) for r in runs.values())
    line = f"- Trained at commit {_commits(first)}; " + (
        "the actors were then re-exported with the current graph, same weights "
        "(`reexport_note` and `reexport_parity_max_abs` in each record)"
        if any("reexport_note" in r for r in runs.values())
        else "exported as trained"
    )
    if rebuilt:
        which = "" if len(rebuilt) == len(runs) else f" ({', '.join(sorted(rebuilt))})"
        line += (
            f". Rebuilt at {_commits(r['commit'] for r in rebuilt.values())}{which}: every "
            "actor weight and every argmax evaluation equal to the first training's "
            "(`rebuild_note` in each record); the records are the rebuilds', which add "
            "the evaluation by draws, and the actors the first training's"
        )
    return line


def kept(run: dict[str, Any]) -> tuple[str, int | None, float]:
    """The actor a run's record exports: "best" or "last", its step (None if the
    history does not hold it) and its evaluation. Records from before the choice was a
    setting kept the best."""
    if run.get("kept") == "last":
        return "last", run["kept_step"], run["kept_eval_qos"]
    best = run["best_eval_qos"]
    return "best", next((h["step"] for h in run["history"] if h["qos"] == best), None), best


def runs_table(runs: dict[str, dict[str, Any]]) -> list[str]:
    """The card's table of runs: budget, speed, best evaluation, the actor kept, and how
    flat each curve's end is, by argmax and by draws."""
    lines = [
        "| run | steps | minutes | steps/s | best eval QoS | kept actor | SQF, same eval | "
        "last-third minus middle-third | the same, by draws | ONNX parity |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        flat = [plateau(run["history"], key) for key in ("qos", "qos_drawn")]
        rule, step, qos = kept(run)
        at = "" if step is None else f", step {step}"
        lines.append(
            f"| {name} | {run['history'][-1]['step']} | {run['seconds'] / 60:.1f} | "
            f"{run.get('steps_per_second', 0):.0f} | {run['best_eval_qos']:.3f} | "
            f"{rule}{at}: {qos:.3f} | "
            f"{run['sqf_eval_qos']:.3f} | "
            + " | ".join("not measured" if f is None else f"{f:+.3f}" for f in flat)
            + f" | {run['onnx_parity_max_abs']:.1e} |"
        )
    return lines


NOT_RECORDED = "not recorded (records name it since 2026-12-05)"


def rebuild_section(model_dir: Path, runs: dict[str, dict[str, Any]]) -> list[str]:
    """How the runs are rebuilt, what each was trained on, and how the rebuilds in
    `model_dir/rebuild/` (runs of the same names) compare (`edgeroute.qos.rebuild`)."""
    trained_on: dict[str, list[str]] = {}
    for name, run in runs.items():
        trained_on.setdefault(processor(run) or NOT_RECORDED, []).append(name)
    lines = [
        "## Rebuilding",
        "",
        "- `edgeroute train qos` with a run's command above trains it again, and",
        "  `edgeroute train qos-rebuilt RUNS REBUILT` says whether that is the same run (actor",
        "  weights, config and every evaluation equal). That holds on the kind of processor",
        "  that trained it: on another, the kernels round the first steps' sums differently",
        "  in the last digit and SAC makes another run of it, to be judged by its metrics",
        "  against the runs' intervals (`bench qos`), not by its weights.",
        *(f"- Processor {where}: {', '.join(names)}." for where, names in trained_on.items()),
    ]
    rebuilt = [
        (n, model_dir / "rebuild" / n)
        for n in runs
        if (model_dir / "rebuild" / n / RECORD).exists()
    ]
    if rebuilt:
        lines += [
            "",
            "Rebuilds in `rebuild/`:",
            "",
            "| run | rebuilt at | rebuilt on | the same run | best eval QoS, committed / rebuilt |",
            "|---|---|---|---|---|",
        ]
        for name, folder in rebuilt:
            found = compare(model_dir / "runs" / name, folder)
            lines.append(
                f"| {name} | `{read_record(folder)['commit']}` | {found.processors[1] or NOT_RECORDED} "
                f"| {'yes' if found.same else 'no'} | {found.best[0]:.4f} / {found.best[1]:.4f} |"
            )
    return [*lines, ""]


def plot_curves(runs: dict[str, dict[str, Any]], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    colours = {"full": "tab:blue", "dsa": "tab:orange", "baseline": "tab:green"}
    for run in runs.values():
        variant = run["config"]["variant"]
        steps = [h["step"] for h in run["history"]]
        ax.plot(steps, [h["qos"] for h in run["history"]], color=colours.get(variant), lw=1)
        drawn = [h.get("qos_drawn") for h in run["history"]]
        if all(q is not None for q in drawn):  # records before it was measured lack it
            ax.plot(steps, drawn, color=colours.get(variant), lw=1, ls=":")
    if any("qos_drawn" in h for run in runs.values() for h in run["history"]):
        ax.plot([], [], color="grey", lw=1, ls=":", label="by draws (solid: argmax)")
    sqf = [run["sqf_eval_qos"] for run in runs.values()]
    if sqf:
        ax.axhline(statistics.fmean(sqf), color="k", ls="--", lw=1, label="SQF")
    drawn_variants = {run["config"]["variant"] for run in runs.values()}
    for variant, colour in colours.items():
        if variant in drawn_variants:  # the legend names only what the plot shows
            ax.plot([], [], color=colour, label=variant)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("eval QoS (training hardware and prompts)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out)


def write_curves(paths: Sequence[Path], out: Path) -> Path:
    """The learning curves of runs, as the model card draws them, written to `out`:
    each path a run (a folder with its record) or a folder of runs."""
    runs: dict[str, dict[str, Any]] = {}
    for path in paths:
        found = {path.name: read_record(path)} if (path / RECORD).exists() else runs_of(path)
        if not found:
            raise SystemExit(f"no training records in {path}")
        if twice := sorted(found.keys() & runs.keys()):
            # the plot names runs by their folders: one of the two would be lost
            raise SystemExit(f"two runs named {', '.join(twice)}; plot them apart")
        runs.update(found)
    plot_curves(runs, out)
    return out


def _in_repo(path: Path) -> Path:
    return path.resolve().relative_to(MODEL_ROOT.parents[1])


def _named(path: Path) -> str:
    """A results file as a card names it: its agents, their runs and the command are in
    its config."""
    return f"`{_in_repo(path)}`; its agents' runs are in its config"


def _sim_section(path: Path, source: str) -> list[str]:
    """The card's table of a `bench qos` results file: each agent against the best
    heuristic at each setting, over the environment seeds and, where the file keeps
    each training run's figures, counting the runs too; nothing if there is no such
    file."""
    bench = _json(path)
    if not bench:
        return []
    lines = [
        f"## Evaluation in simulation ({source})",
        "",
        "Verdicts: the agent's 95% interval above the best heuristic's (`wins`), below it",
        "(`loses`) or overlapping (`tie`). Over the seeds, the agent's training runs are",
        "averaged on each seed: whether these runs beat the heuristic. Counting the runs,",
        "their spread is a second source beside the seeds (`edgeroute.stats.crossed_interval`):",
        "whether training the agent again would.",
        "",
        "| setting | agent | agent QoS | best heuristic | its QoS | verdict | "
        "agent QoS, counting runs | verdict, counting runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = bench["results"]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        here = [r for r in rows if r["setting"] == setting]
        best = max(
            (r for r in here if not r.get("agent") and not r.get("reference")),
            key=lambda r: r["qos"],
        )
        for r in here:
            if r.get("agent"):
                lines.append(
                    f"| {setting} | {r['policy']} | {r['qos_ci']} | {best['policy']} | "
                    f"{best['qos_ci']} | {r.get('against_best', '')} | {_counting_runs(r, best)} |"
                )
    return [*lines, ""]


def _counting_runs(agent: dict[str, Any], best: dict[str, Any]) -> str:
    """The agent's interval counting its training runs and its verdict against the best
    heuristic's (one policy, so its interval is over the seeds); blank cells where the
    file does not keep each run's figures."""
    if "per_run_qos" not in agent:
        return " | "
    ci = crossed_interval(agent["per_run_qos"])
    return f"{interval_shown(*ci)} | {verdict(ci, interval(best['per_seed_qos']))}"


def _seeds(cfg: dict[str, Any]) -> str:
    seeds = cfg.get("seeds")
    return f"; seeds {seeds[0]}-{seeds[-1]}" if isinstance(seeds, list) and seeds else ""


def _live_section(path: Path, source: str) -> list[str]:
    """The card's table of a `bench qos --live` results file; nothing if there is none."""
    live = _json(path)
    if not live:
        return []
    cfg = live.get("config", {})
    setting = ", ".join(
        f"{name} {cfg[key]:g}"
        for key, name in (("engines", "N ="), ("rate", "lambda ="), ("latency_ms", "L (ms) ="))
        if cfg.get(key) is not None
    )
    lines = [
        f"## Live, through the gateway ({source})",
        "",
        *([f"Setting: {setting}{_seeds(cfg)}.", ""] if setting else []),
        "| policy | QoS | met L | drops | requests |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['policy']} | {r['qos_ci']} | {r['met_share_ci']} | {r['drop_rate']:.1%} | "
        f"{r['requests']} |"
        for r in live["results"]
    ]
    return [*lines, ""]


def card_suffix(model_dir: Path) -> str:
    """What the files a folder's card writes and reads take in their names: its path
    under models/qos ("" for models/qos itself, "_routerdc" for its RouterDC world)."""
    parts = model_dir.resolve().relative_to(MODEL_ROOT).parts
    return "".join(f"_{part}" for part in parts)


def write_card(
    model_dir: Path, data_dir: Path, sim: Sequence[Path] = (), live: Sequence[Path] = ()
) -> Path:
    """`model_dir`'s MODEL_CARD.md (`card_text`) and its runs' learning curves."""
    runs = runs_of(model_dir / "runs")
    if not runs:
        raise SystemExit(f"no training records in {model_dir / 'runs'}")
    plot_curves(runs, RESULTS / f"qos_training{card_suffix(model_dir)}.png")
    path = model_dir / "MODEL_CARD.md"
    path.write_text(card_text(model_dir, runs, data_dir, sim, live))
    print(f"wrote {path}")
    return path


def card_text(
    model_dir: Path,
    runs: dict[str, dict[str, Any]],
    data_dir: Path,
    sim: Sequence[Path] = (),
    live: Sequence[Path] = (),
) -> str:
    """The model card of `model_dir`, from its runs' records (`runs_of`) and the
    results files `sim` and `live` (by default those named after the folder,
    `card_suffix`)."""
    full = {k: v for k, v in runs.items() if v["config"]["variant"] == "full"}
    shipped = max(full or runs, key=lambda k: kept(runs[k])[2])
    cfg = runs[shipped]["config"]
    latencies = latency_range(cfg)
    quality = cfg.get("quality", QUALITIES[0])
    suffix = card_suffix(model_dir)
    # the command of each set of runs that differ only in variant and seed
    commands: dict[str, list[str]] = {}
    for run in runs.values():
        config = run["config"]
        variants = commands.setdefault(
            TrainConfig.from_record(config).flags(leave_out=("variant", "seed")), []
        )
        if config["variant"] not in variants:
            variants.append(config["variant"])
    splits = {
        s: len(load_tasks(data_dir, split=s, quality=quality))
        for s in ("predictor", "agent", "eval")
    }
    folder = _in_repo(model_dir)
    predictors = predictor_dir(model_dir)
    lines = [
        "# QoS-DRL router: model card"
        + (f" ({quality} quality)" if quality != QUALITIES[0] else "")
        + (f": {model_dir.name}" if suffix != quality_suffix(quality) else ""),
        "",
        "Written by `edgeroute train qos-card` from the training records in `runs/` and the",
        "benchmark results; figures are those runs' own.",
        "",
        "## Files",
        "",
        f"- `actor.onnx`: the actor of `runs/{shipped}` (the `full` run whose kept actor",
        "  evaluated best on training hardware), HAN encoder and pointer head as one graph;",
        "  inputs as in `policies/qos_state.py`, output logits over {drop, expert 1..N}.",
        "- `runs/<variant>-s<seed>/`: every training run's actor and record:",
        "  `full` (HAN + eq. 16's reward), `dsa` (HAN + completion reward) and `baseline`",
        "  (Baseline RL: expert-level features + completion reward), same budget and seeds.",
        (
            "- `predictor.onnx`, `predictor.json`: the score and length predictor."
            if predictors == model_dir.resolve()
            else f"- The score and length predictor: `{_in_repo(predictors)}/`'s "
            "`predictor.onnx` and `predictor.json`, its world's."
        ),
        "",
        "## How it was trained",
        "",
        trained_at(runs) + f". Training code last changed at `{_commit()}`.",
        *(
            f"- Each run{'' if len(commands) == 1 else ' of ' + ', '.join(variants)}: "
            f"`edgeroute train qos{options} --variant V --seed S --out {folder}/runs/V-sS`"
            for options, variants in commands.items()
        ),
        *(
            [
                "- Runs kept at their last step whose config keeps the best (the table of "
                "runs says which) had their last actor exported afterwards, with "
                "`edgeroute train qos-last RUN --out FOLDER`."
            ]
            if any(
                r.get("kept") == "last" and r["config"].get("keep") != "last" for r in runs.values()
            )
            else []
        ),
        "- The other settings are the defaults of `edgeroute/qos/config.py`; then "
        f"`cp {folder}/runs/{shipped}/actor.onnx {folder}/` and "
        f"`edgeroute train qos-card --model-dir {folder}"
        + "".join(f" --sim {_in_repo(p)}" for p in sim)
        + "".join(f" --live {_in_repo(p)}" for p in live)
        + "`.",
        f"- Config: {', '.join(f'{k}={v}' for k, v in cfg.items() if k not in ('variant', 'seed'))}.",
        f"- Environment: `sim/edge.py`, N={cfg['experts']}; each episode draws its hardware "
        f"from seeds {TRAIN_HARDWARE.start}-{TRAIN_HARDWARE.stop - 1} "
        f"({Fleet.from_record(cfg).describe()})"
        + (
            f", lambda in {rate_range(cfg)} and L in {latencies}."
            if cfg.get("randomise")
            else f", lambda={cfg['rate']}/s, L={cfg['latency_ms']} ms."
        ),
        f"- Prompts ({QUALITY_PROMPTS[quality]}, split by a hash of the prompt): predictor "
        f"{splits['predictor']}, agent {splits['agent']}, evaluation {splits['eval']}. "
        "Predictions in training are the served predictor's outputs.",
        (
            "- Checkpoints are chosen on one episode at each point of the paper's sweep "
            "(lambda 3-8/s at L=30 ms, L 20-40 ms at lambda=5) "
            if cfg.get("select_on") == "sweep"
            else f"- Checkpoints are chosen on {cfg.get('eval_episodes', 4)} episodes of the "
            "default setting (lambda=5, L=30 ms) "
        )
        + f"on training hardware and agent prompts; evaluation uses hardware seed 0 and "
        f"{HELD_OUT_HARDWARE[0]}-{HELD_OUT_HARDWARE[-1]} and the evaluation prompts.",
        "",
        "## Runs",
        "",
        *runs_table(runs),
        "",
        f"Learning curves: `edgeroute/bench/results/qos_training{suffix}.png` (solid by the",
        "argmax, which checkpoints are chosen and served by; dotted by draws from the same",
        "policy, where the record has them: the argmax curve can dip where the policy has",
        "not, when its most likely action sends most requests to one expert).",
        "",
        *rebuild_section(model_dir, runs),
    ]
    flag = quality_flag(quality)
    for path in sim or [RESULTS / f"qos{suffix}.json"]:
        lines += _sim_section(
            path,
            f"`edgeroute bench qos{flag}`, held-out prompts and hardware"
            if not sim
            else _named(path),
        )
    for path in live or [RESULTS / f"qos_live{suffix}.json"]:
        lines += _live_section(
            path, f"`edgeroute bench qos --live{flag}`" if not live else _named(path)
        )
    pred = _json(predictors / "predictor.json")
    if pred:
        lines += [
            "## The predictor",
            "",
            f"- `{pred['encoder']}` encoder; trained on {pred['train']} samples, tested on "
            f"{pred['test']} (prompts of the predictor split only are trained on).",
            f"- Score top-1 {pred['score_top1']:.3f} (majority bucket "
            f"{pred['majority_score_top1']:.3f}); length top-1 {pred['length_top1']:.3f} "
            f"(majority {pred['majority_length_top1']:.3f}), top-3 {pred['length_top3']:.3f}.",
            (
                "- RouterBench's MBPP scores are 0/1, so the score head has little to learn."
                if quality == "routerbench"
                else f"- Expected score against the true one, correlation {pred['score_corr']:.3f}."
            ),
            "  See docs/research.md for what this means for the router.",
            "",
        ]
    return "\n".join(lines)
