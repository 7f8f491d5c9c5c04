"""What ``eva collect`` records, in words: each stream's source (``--list``, ``--list --json``)
and the header a run prints before it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eva.cli.output import emit_json, first_line, say


def stream_source(stream: Any, override: str | None) -> tuple[str, str]:
    """``(kind, one-line description)`` of what feeds one camera / vector stream: the
    ``--source`` override, else the stream's ``source`` (None: the simulator)."""
    if override == "sim":
        return "sim", "sim (simulated rig, --source sim)"
    if override is not None:
        return "replay", f"replay of {override.removeprefix('replay:')}"
    source = getattr(stream, "source", None)
    if source is None:
        return "sim", "sim (simulated rig: no source configured)"
    kind = str(getattr(source, "kind", "") or "unknown")
    describe = getattr(source, "describe", None)
    try:
        text = first_line(str(describe())) if callable(describe) else ""
    except Exception as e:  # a screen must not die of a description
        text = f"({type(e).__name__})"
    if not text:
        return kind, kind
    return kind, text if text.split(" ", 1)[0] == kind else f"{kind} ({text})"


def source_summary(cfg: Any, override: str | None, config_path: Path) -> tuple[str, str]:
    """``(mode, one line)``: what this run records; ``mode`` is sim, replay or configured."""
    from eva.capture.rig import has_sources

    if override == "sim":
        return "sim", "recording the SIMULATOR (--source sim): no device is read"
    if override is not None:
        path = override.removeprefix("replay:")
        return "replay", f"recording a REPLAY of {path} (--source replay): no device is read"
    if not has_sources(cfg):
        return "sim", (
            f"recording the SIMULATOR: no stream in {config_path} has a source "
            "(source = {kind = ...} in a camera or vector table)"
        )
    kinds = [stream_source(s, None)[0] for s in (*cfg.cameras, *cfg.vectors)]
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
    if set(kinds) == {"sim"}:
        return "configured", f"recording the SIMULATOR for every stream (configured: {counts})"
    text = f"recording the configured sources ({counts})"
    if "sim" in kinds:
        text += f"; {kinds.count('sim')} stream(s) from the SIMULATOR"
    return "configured", text


def collect_streams(cfg: Any, override: str | None) -> dict[str, list[dict[str, Any]]]:
    """Cameras and vector streams with their sources, as ``--list --json`` shows them."""

    def source(stream: Any) -> dict[str, str]:
        kind, text = stream_source(stream, override)
        return {"kind": kind, "description": text}

    return {
        "cameras": [
            {"key": c.key, "width": c.width, "height": c.height, "source": source(c)}
            for c in cfg.cameras
        ],
        "vectors": [
            {"name": v.name, "dim": v.dim, "discrete": list(v.discrete), "source": source(v)}
            for v in cfg.vectors
        ],
    }


def collect_header(cfg: Any, override: str | None, config_path: Path) -> list[str]:
    """What is recorded, one line per stream (printed when a run starts)."""
    lines = [source_summary(cfg, override, config_path)[1]]
    streams = collect_streams(cfg, override)
    for c in streams["cameras"]:
        lines.append(
            f"  camera {c['key']} {c['width']}x{c['height']}: {c['source']['description']}"
        )
    for v in streams["vectors"]:
        discrete = f" discrete {','.join(map(str, v['discrete']))}" if v["discrete"] else ""
        lines.append(f"  vector {v['name']} dim {v['dim']}{discrete}: {v['source']['description']}")
    return lines


def print_list(cfg: Any, override: str | None, config_path: Path, as_json: bool) -> None:
    """``--list``: the streams, their sources and the datasets with their prompts."""
    mode, summary = source_summary(cfg, override, config_path)
    streams = collect_streams(cfg, override)
    datasets = [
        {"name": name, "dir": str(cfg.dataset_dir(name)), "prompts": list(prompts)}
        for name, prompts in cfg.tasks.items()
    ]
    if as_json:
        emit_json(
            {
                "config": str(config_path),
                "fps": cfg.fps,
                "log_dir": str(cfg.log_dir),
                "recording": mode,
                "summary": summary,
                "source_override": override,
                **streams,
                "datasets": datasets,
            }
        )
        return
    lines = [f"config {config_path}: {cfg.fps} fps, log_dir {cfg.log_dir}", summary]
    lines.append(f"cameras ({len(streams['cameras'])}):")
    for c in streams["cameras"]:
        lines.append(
            f"  {c['key']}  {c['width']}x{c['height']}  source {c['source']['description']}"
        )
    lines.append(f"vectors ({len(streams['vectors'])}):")
    for v in streams["vectors"]:
        discrete = ",".join(map(str, v["discrete"])) or "-"
        lines.append(
            f"  {v['name']}  dim {v['dim']}  discrete {discrete}  "
            f"source {v['source']['description']}"
        )
    lines.append(f"datasets ({len(datasets)}):")
    for d in datasets:
        lines.append(f"  {d['name']} -> {d['dir']}")
        lines.extend(f"    task {i}: {p}" for i, p in enumerate(d["prompts"], 1))
    for line in lines:
        say(line)
