"""Workers of the source kinds whose samples come from a Python object with ``samples()``:
``python`` (a plugin: ``object = "package.module:Factory"`` called with ``args``) and ``sim``
(the simulated rig). Each sample keeps the time the object gives it (the simulated rig's clock
starts at the wall clock; a plugin documents its own: the same wall clock)."""

from __future__ import annotations

from eva.capture.source_context import SourceContext, load_object, push_samples


def run_plugin(ctx: SourceContext) -> None:
    target = ctx.source["object"]
    factory = load_object(target)
    plugin = factory(**dict(ctx.source.get("args") or {}))
    if not callable(getattr(plugin, "samples", None)):
        raise TypeError(f"{target}: the object it made has no samples() method")
    ctx.events.send("opened", None, f"python {target}")
    push_samples(ctx, plugin.samples())


def run_sim(ctx: SourceContext) -> None:
    from eva.capture.sources import SimulatedRig
    from eva.config import CameraConfig, VectorConfig

    streams = ctx.streams
    cameras = [CameraConfig(s.name, s.shape[1], s.shape[0]) for s in streams if s.kind == "camera"]
    vectors = [VectorConfig(s.name, s.shape[0]) for s in streams if s.kind == "vector"]
    seed = int(ctx.source.get("seed", 0))
    rig = SimulatedRig(cameras, vectors, fps=ctx.fps, realtime=True, seed=seed)
    ctx.events.send("opened", None, "sim")
    push_samples(ctx, rig.samples())
