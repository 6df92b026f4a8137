# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The table of `scale.py`'s results (stdlib only; `scale.py` loads it by path): per stage what ran (grouping,
GPUs, steps, commit), its wall time, peak GPU memory and peak host RSS, its phases, and the issues' targets beside
the figures."""

STAGES = ("data", "group", "train", "resume", "evaluate", "predict", "export", "reload", "add-labels")
GIB = 2**30
# Keys of a probe report's phases, in the order the table lists them.
TRAIN_PHASES = (
    "read",
    "layout",
    "label counts",
    "label embeddings",
    "grouping",
    "clustering",
    "greedy groups",
    "model",
    "label texts",
    "training",
    "checkpoint",
    "resume load",
    "save",
    "test evaluation",
    "load model",
    "top-k",
    "export",
    "load",
    "add labels",
    "save folder",
)
TARGETS = {
    "grouping s": 180.0,
    "embedded texts/s": 20_000.0,
    "group peak RSS GiB": 8.0,
    "stage peak RSS GiB": 16.0,
    "texts/s evaluate, predict": 5_000.0,
    "export, reload s": 120.0,
    "checkpoint s": 60.0,
    "two GPUs peak ratio": 0.6,
}
# The train stage's peak GPU memory by preset (issue 37: 8.6M labels within 10 GiB; 10^8 within 40 GiB, an H100).
TRAIN_PEAK_GIB = {"lf-paper2keywords-8.6m": 10.0, "synthetic-100m": 40.0}
# texts/s on N GPUs against one (issue 37 item 4: 2 GPUs; issue 42 item 1: 4 GPUs).
SPEED_UP_TARGETS = {2: 1.9, 4: 3.7}


def _gib(value) -> str:
    return "-" if not value else f"{value / GIB:.2f}"


def stage_peaks(stage: dict) -> tuple[float, float, float]:
    """(peak GPU allocated, reserved, host RSS) over the stage's processes (the busiest rank)."""
    reports = stage.get("reports") or []
    allocated = max((r["gpu_allocated"] for r in reports), default=0)
    reserved = max((r["gpu_reserved"] for r in reports), default=0)
    return allocated, reserved, stage.get("tree_rss", 0)


def phase_rows(stage: dict) -> list[tuple[str, float, int, int]]:
    """(phase, seconds summed over its calls, peak GPU allocated, peak host RSS) of rank 0, in the order of
    `TRAIN_PHASES`. The RSS is the phase's own sampled peak (`rss_peak`); reports without it give the process's
    peak so far at the phase's end, where the first phase whose RSS jumps is the one that took the memory."""
    reports = stage.get("reports") or []
    if not reports:
        return []
    totals = {}
    for phase in reports[0]["phases"]:
        seconds, peak, rss = totals.get(phase["name"], (0.0, 0, 0))
        totals[phase["name"]] = (
            seconds + phase["seconds"],
            max(peak, phase["allocated"]),
            max(rss, phase.get("rss_peak", phase["rss"])),
        )
    order = [name for name in TRAIN_PHASES if name in totals] + [n for n in totals if n not in TRAIN_PHASES]
    return [(name, *totals[name]) for name in order]


def texts_per_second(stage: dict) -> float | None:
    reports = stage.get("reports") or []
    return reports[0].get("texts_per_second") if reports else None


def metric_note(metrics: dict | None, chance: dict | None) -> str:
    if not metrics:
        return ""
    parts = []
    for k in (1, 3, 5):
        value = metrics.get(f"P@{k}")
        if value is None:
            continue
        text = f"P@{k} {100 * value:.2f}"
        if chance:
            text += f" (top-frequency {100 * chance[f'most frequent P@{k}']:.2f}, random {100 * chance[f'random P@{k}']:.4f})"
        parts.append(text)
    return "; ".join(parts)


def phase_seconds(stage: dict | None, name: str) -> float | None:
    return next((seconds for phase, seconds, *_ in phase_rows(stage or {}) if phase == name), None)


def stage_rate(name: str, stage: dict, data: dict) -> float | None:
    """Texts a second of a stage's main phase: the label embeddings of `group` (training texts), the scoring of
    `evaluate` and `predict` (test texts)."""
    phase, texts = {
        "group": ("label embeddings", data.get("train_points")),
        "evaluate": ("test evaluation", data.get("test_points")),
        "predict": ("top-k", data.get("test_points")),
    }.get(name, (None, None))
    seconds = phase_seconds(stage, phase) if phase else None
    return texts / seconds if texts and seconds else None


def markdown(results: dict, compare: dict | None = None) -> str:
    stages, data = results["stages"], results.get("data") or {}
    args = results["args"]
    devices = {r["device"] for s in stages.values() for r in s.get("reports") or []}
    lines = [
        f"# haste-hf at scale: {args['preset']} x {args['scale']} ({', '.join(sorted(devices)) or '?'}, {args['gpus']} process(es) for train/resume)",
        "",
        f"Commit: {results.get('commit', 'not recorded')}.",
        "",
    ]
    if data:
        lines += [
            f"Data: {data['train_points']:,} train / {data['test_points']:,} test points, {data['labels']:,} labels, "
            f"{data['labels_per_train_point']:.2f} labels per point, {data['points_per_label']:.2f} points per label, "
            f"most frequent label in {100 * data['head_share_of_points']:.1f}% of the points, "
            f"{data['labels_seen_once']:,} labels seen once. Encoder: {args['encoder']}; train steps {args['max_steps']} "
            f"+ {args['resume_steps']} resumed, {args['workers']} data-loader workers; other train flags "
            f"{' '.join(args['train_flag']) or '(defaults)'}; group flags {' '.join(args['group_flag']) or '(defaults)'}.",
            "",
        ]
    lines += [
        "| stage | what ran | wall s | peak GPU GiB (allocated / reserved) | peak host RSS GiB | notes |",
        "|---|---|---|---|---|---|",
    ]
    for name in STAGES:
        stage = stages.get(name)
        if stage is None:
            continue
        if "skipped" in stage:
            lines.append(f"| {name} | - | - | - | - | skipped: {stage['skipped']} |")
            continue
        allocated, reserved, rss = stage_peaks(stage)
        notes = [] if stage["exit"] == 0 else [stage.get("stopped") or f"FAILED (exit {stage['exit']})"]
        reports = stage.get("reports") or []
        if len(reports) > 1 and any(r["gpu_allocated"] for r in reports):
            notes.append("peak GPU GiB a rank " + ", ".join(_gib(r["gpu_allocated"]) for r in reports))
        speed = texts_per_second(stage)
        if speed:
            notes.append(f"{speed:,.0f} texts/s")
        rate = stage_rate(name, stage, data)
        if rate:
            notes.append(f"{rate:,.0f} texts/s ({'label embeddings' if name == 'group' else 'scoring'})")
        notes.append(metric_note(stage.get("metrics"), data.get("chance")))
        for report in (stage.get("reports") or [])[:1]:
            if "top1_agreement" in report:
                notes.append(
                    f"{report['reloaded']}: top-1 agrees with predict on {100 * report['top1_agreement']:.1f}%"
                )
        lines.append(
            f"| {name} | {stage.get('ran', '?')} | {stage['wall']:.1f} | {_gib(allocated)} / {_gib(reserved)} | {_gib(rss)} | {'; '.join(n for n in notes if n)} |"
        )
        for phase, seconds, peak, phase_rss in phase_rows(stage):
            lines.append(f"| &nbsp;&nbsp;{name}: {phase} | | {seconds:.1f} | {_gib(peak)} | {_gib(phase_rss)} | |")
    lines += ["", *targets(results, compare)]
    return "\n".join(lines) + "\n"


def targets(results: dict, compare: dict | None) -> list[str]:
    """The issues' targets beside the figures (they apply to the 8.6M preset at scale 1 on an H100)."""
    stages, data = results["stages"], results.get("data") or {}
    preset = results["args"]["preset"]
    lines = [f"| target ({preset}, H100, MiniLM, defaults) | goal | measured |", "|---|---|---|"]
    ran = {name: stage for name, stage in stages.items() if "wall" in stage}
    train_peak = max(
        (stage_peaks(stages[n])[0] for n in ("train", "resume") if n in stages and "reports" in stages[n]), default=None
    )
    if train_peak and preset in TRAIN_PEAK_GIB:
        lines.append(
            f"| train: peak GPU (busiest rank) | <= {TRAIN_PEAK_GIB[preset]:.0f} GiB | {_gib(train_peak)} GiB |"
        )
    if "group" in ran:
        group = ran["group"]
        lines.append(
            f"| grouping (`haste-hf group`, {group.get('ran', '?')}) | <= {TARGETS['grouping s']:.0f} s | {group['wall']:.0f} s |"
        )
        rate = stage_rate("group", group, data)
        if rate:
            lines.append(
                f"| training texts embedded | >= {TARGETS['embedded texts/s']:,.0f} a second | {rate:,.0f} a second |"
            )
        lines.append(
            f"| grouping: peak host RSS | <= {TARGETS['group peak RSS GiB']:.0f} GiB | {_gib(stage_peaks(group)[2])} GiB |"
        )
    if ran:
        name, stage = max(ran.items(), key=lambda item: stage_peaks(item[1])[2])
        lines.append(
            f"| every stage: peak host RSS | <= {TARGETS['stage peak RSS GiB']:.0f} GiB | {_gib(stage_peaks(stage)[2])} GiB ({name}) |"
        )
    for name in ("evaluate", "predict"):
        rate = stage_rate(name, ran[name], data) if name in ran else None
        if rate:
            lines.append(f"| {name}: texts/s | >= {TARGETS['texts/s evaluate, predict']:,.0f} | {rate:,.0f} |")
    for name in ("export", "reload"):
        if name in ran:
            lines.append(f"| {name} | <= {TARGETS['export, reload s']:.0f} s | {ran[name]['wall']:.0f} s |")
    checkpoints = [
        s for n in ("train", "resume") for name, s, *_ in phase_rows(stages.get(n, {})) if name == "checkpoint"
    ]
    if checkpoints:
        lines.append(f"| checkpoint save | <= {TARGETS['checkpoint s']:.0f} s | {max(checkpoints):.1f} s |")
    if compare and "train" in stages and "train" in compare["stages"]:
        mine, theirs = stages["train"], compare["stages"]["train"]
        gpus = results["args"]["gpus"]
        base_peak = stage_peaks(theirs)[0]
        if base_peak:
            ratio = stage_peaks(mine)[0] / base_peak
            goal = f"<= {TARGETS['two GPUs peak ratio']}" if gpus == 2 else "(reported)"
            lines.append(f"| busiest rank's peak GPU vs one GPU's ({gpus} GPUs) | {goal} | {ratio:.2f} |")
        speed, base = texts_per_second(mine), texts_per_second(theirs)
        if speed and base:
            goal = SPEED_UP_TARGETS.get(gpus)
            goal = f">= {goal}x" if goal else "(reported)"
            lines.append(f"| texts/s vs one GPU ({gpus} GPUs) | {goal} | {speed / base:.2f}x |")
    return lines
