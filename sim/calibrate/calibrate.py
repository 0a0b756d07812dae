#!/usr/bin/env python3
"""Measure the step-cost constants of a vllm-sim profile on a GPU.

Builds a decoder stack with the shapes of the model in `--config` (random bf16 weights, nothing
downloaded), times engine steps of known shape with CUDA events, fits the six constants of the
simulator's step-cost model by non-negative least squares and writes a profile TOML file that
`vllm-sim --profile-file` loads (`status = "measured"`).

The model fitted (sim/src/profile.rs, sim/README.md "Step time"):

    step_ms = overhead + max(weight_read_ms, (prefill_tokens + decode_seqs) * per_token_ms)
              + prefill_attention_pairs * per_attention_pair_ms
              + context_tokens * per_context_token_ms

with overhead = decode_overhead_ms for a decode-only step and mixed_overhead_ms for a step that
carries a prompt chunk. `--dry-run` replaces the GPU timer with a synthetic one (known constants
plus noise) and needs no torch: the grid, the fit and the writer are the same code.

See sim/calibrate/README.md for how to run it and what it does not model.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

COST_KEYS = (
    "decode_overhead_ms",
    "mixed_overhead_ms",
    "weight_read_ms",
    "per_token_ms",
    "per_attention_pair_ms",
    "per_context_token_ms",
)

#: The constants the dry run's synthetic timer is built from (H100-like magnitudes: 16 GB of
#: weights at ~2.9 TB/s, 16 GFLOP a token at ~570 TFLOP/s, 524,288 FLOP an attention pair at
#: ~440 TFLOP/s, 128 KiB of KV a context token at ~2.6 TB/s).
DRY_RUN_TRUTH = {
    "decode_overhead_ms": 0.9,
    "mixed_overhead_ms": 2.4,
    "weight_read_ms": 5.6,
    "per_token_ms": 0.028,
    "per_attention_pair_ms": 1.2e-6,
    "per_context_token_ms": 5.0e-5,
}
#: Relative standard deviation of the synthetic timer's noise.
DRY_RUN_NOISE = 0.01
#: Free GPU memory the dry run pretends to see (an idle H100 80GB), for `[kv] gpu_blocks`.
DRY_RUN_FREE_BYTES = int(79.1 * 2**30)

#: Decode points whose batch x context exceeds this many tokens are left out of the grid (their
#: KV would not fit next to the weights when many layers are timed).
MAX_DECODE_TOKENS = 262_144
#: KV cache block size of vLLM (tokens a block).
BLOCK_TOKENS = 16
#: Share of free GPU memory vLLM uses by default (`--gpu-memory-utilization 0.9`).
GPU_MEMORY_UTILIZATION = 0.9
#: Smallest anchor tolerance written (relative).
MIN_TOLERANCE = 0.05


# --------------------------------------------------------------------------------------------
# Step shapes and the grid
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One engine step to time: `decode_seqs` sequences decoding one token each at
    `decode_context` tokens of length (the new token included), plus prompt chunks `(n, p)`:
    `n` prompt tokens starting at position `p` of their sequence."""

    decode_seqs: int = 0
    decode_context: int = 0
    chunks: Tuple[Tuple[int, int], ...] = ()
    #: 0: needed to identify every constant; 1: refines the fit (measured while budget lasts).
    tier: int = 1

    @property
    def kind(self) -> str:
        if not self.chunks:
            return "decode"
        return "prefill" if self.decode_seqs == 0 else "mixed"

    @property
    def prefill_tokens(self) -> int:
        return sum(n for n, _ in self.chunks)

    @property
    def prefill_seqs(self) -> int:
        return len(self.chunks)

    @property
    def prefill_attention_pairs(self) -> int:
        return sum(n * p + n * (n + 1) // 2 for n, p in self.chunks)

    @property
    def context_tokens(self) -> int:
        return self.decode_seqs * self.decode_context

    @property
    def tokens(self) -> int:
        """Tokens through the linear layers: prompt tokens plus one per decoding sequence."""
        return self.prefill_tokens + self.decode_seqs

    @property
    def label(self) -> str:
        parts = []
        if self.decode_seqs:
            parts.append(f"decode {self.decode_seqs}x{self.decode_context}")
        for n, p in self.chunks:
            parts.append(f"chunk {n}@{p}")
        return " + ".join(parts)

    def describe(self) -> str:
        """A sentence for an anchor's `what`."""
        parts = []
        if self.decode_seqs:
            s = "s" if self.decode_seqs > 1 else ""
            parts.append(
                f"{self.decode_seqs} sequence{s} decoding at {self.decode_context} tokens"
                + (" each" if self.decode_seqs > 1 else "")
            )
        for n, p in self.chunks:
            article = "an" if str(n)[0] == "8" or str(n)[:2] in ("11", "18") else "a"
            parts.append(f"{article} {n}-token prompt chunk at position {p}")
        return f"{self.kind} step: " + ", ".join(parts)


@dataclass(frozen=True)
class Grid:
    """The grid's axes (recorded in `[calibration.grid]`) and its points, tier 0 first."""

    name: str
    decode_batches: Tuple[int, ...]
    decode_contexts: Tuple[int, ...]
    chunk_sizes: Tuple[int, ...]
    chunk_positions: Tuple[int, ...]
    points: Tuple[Point, ...]


def _dedup(points: Sequence[Point]) -> Tuple[Point, ...]:
    seen = set()
    out = []
    for pt in points:
        key = (pt.decode_seqs, pt.decode_context, pt.chunks)
        if key not in seen:
            seen.add(key)
            out.append(pt)
    return tuple(out)


def _dec(b: int, ctx: int, tier: int) -> Point:
    return Point(decode_seqs=b, decode_context=ctx, tier=tier)


def _pre(chunks: Sequence[Tuple[int, int]], tier: int, b: int = 0, ctx: int = 0) -> Point:
    return Point(decode_seqs=b, decode_context=ctx, chunks=tuple(chunks), tier=tier)


def build_grid(name: str = "full") -> Grid:
    """The points to time. Tier 0 identifies all six constants on its own: decode-only steps at
    small and large batch and at long context, weight-bound steps with a prompt chunk (few
    tokens: separates `mixed_overhead_ms` from `weight_read_ms`), compute-bound chunks at
    position 0 and late in a long prompt (the attention term), and mixed steps."""
    if name == "full":
        batches = (1, 4, 16, 64, 128, 256, 512)
        contexts = (256, 512, 1024, 2048, 4096, 8192)
        sizes = (16, 64, 256, 512, 1024, 2048, 4096, 8192)
        positions = (0, 2048, 4096, 6144, 8192, 12288, 24576)
        core = [
            _dec(1, 1024, 0),
            _dec(64, 2048, 0),
            _dec(256, 1024, 0),
            _dec(32, 8192, 0),
            _pre([(16, 0)], 0),
            _pre([(512, 0)], 0),
            _pre([(2048, 0)], 0),
            _pre([(8192, 0)], 0),
            _pre([(512, 12288)], 0),
            _pre([(2048, 12288)], 0),
            _pre([(64, 0)], 0, b=8, ctx=2048),
            _pre([(512, 0)], 0, b=32, ctx=1024),
        ]
        more = [_dec(b, c, 1) for b in batches for c in contexts if b * c <= MAX_DECODE_TOKENS]
        more += [_pre([(n, 0)], 1) for n in (32, 64, 128, 256, 384, 1024, 4096)]
        # Cheap steps either side of the weight-bound/compute-bound crossover (~200 tokens on
        # an H100): they are what separates the overheads from weight_read_ms.
        more += [_pre([(n, p)], 1) for n, p in ((16, 4096), (64, 8192), (128, 2048), (320, 0))]
        more += [
            _pre([(16, 0)], 1, b=4, ctx=512),
            _pre([(64, 0)], 1, b=32, ctx=1024),
            _pre([(64, 0)], 1, b=64, ctx=1024),
            _pre([(128, 1024)], 1, b=8, ctx=4096),
            _pre([(256, 0)], 1, b=16, ctx=2048),
        ]
        more += [_pre([(512, p)], 1) for p in (2048, 6144, 24576)]
        more += [_pre([(2048, p)], 1) for p in (4096, 24576)]
        more += [_pre([(8192, 8192)], 1)]
        more += [
            _pre([(512, 0)] * 4, 1),
            _pre([(2048, 0), (2048, 0)], 1),
            _pre([(256, 0), (256, 4096)], 1),
            _pre([(32, 0)], 1, b=1, ctx=1024),
            _pre([(128, 0)], 1, b=16, ctx=1024),
            _pre([(512, 4096)], 1, b=64, ctx=2048),
            _pre([(2048, 0)], 1, b=128, ctx=1024),
            _pre([(256, 12288)], 1, b=16, ctx=4096),
            _pre([(512, 0)], 1, b=128, ctx=2048),
        ]
    elif name == "small":
        # For a CPU smoke test of the real path (`--device cpu --layers 1 --grid small`).
        batches = (1, 4, 16)
        contexts = (128, 512)
        sizes = (16, 64)
        positions = (0, 256)
        core = [
            _dec(1, 128, 0),
            _dec(4, 512, 0),
            _dec(16, 128, 0),
            _dec(16, 512, 0),
            _pre([(16, 0)], 0),
            _pre([(64, 0)], 0),
            _pre([(16, 256)], 0),
            _pre([(64, 256)], 0),
            _pre([(16, 0)], 0, b=4, ctx=128),
            _pre([(64, 128)], 0, b=4, ctx=512),
        ]
        more = []
    else:
        raise ValueError(f"unknown grid {name!r} (full or small)")
    return Grid(name, batches, contexts, sizes, positions, _dedup(core + more))


def coverage_gaps(points: Sequence[Point]) -> List[str]:
    """What the fit needs that `points` lacks (empty when every constant is identifiable)."""
    gaps = []
    decode = [p for p in points if p.kind == "decode"]
    chunked = [p for p in points if p.chunks]
    if len(decode) < 2:
        gaps.append("two decode-only steps")
    if len({p.context_tokens for p in decode}) < 2:
        gaps.append("decode-only steps at two context sizes")
    if not any(p.kind == "mixed" for p in points):
        gaps.append("a mixed step (decodes and a prompt chunk)")
    if not any(p.kind == "prefill" for p in points):
        gaps.append("a prefill-only step")
    if not any(all(pos == 0 for _, pos in p.chunks) for p in chunked):
        gaps.append("a prompt chunk at position 0")
    if not any(any(pos > 0 for _, pos in p.chunks) for p in chunked):
        gaps.append("a prompt chunk late in its prompt")
    if len({p.tokens for p in chunked}) < 3:
        gaps.append("steps with a prompt chunk of three different token counts")
    return gaps


# --------------------------------------------------------------------------------------------
# The cost model and its fit
# --------------------------------------------------------------------------------------------


def model_ms(cost: Dict[str, float], pt: Point) -> float:
    """The simulator's step time for `pt` under `cost` (sim/src/profile.rs)."""
    overhead = cost["mixed_overhead_ms"] if pt.prefill_tokens > 0 else cost["decode_overhead_ms"]
    return (
        overhead
        + max(cost["weight_read_ms"], pt.tokens * cost["per_token_ms"])
        + pt.prefill_attention_pairs * cost["per_attention_pair_ms"]
        + pt.context_tokens * cost["per_context_token_ms"]
    )


def _solve_spd(a: List[List[float]], b: List[float]) -> List[float]:
    """Solves a small symmetric positive (semi)definite system by Gaussian elimination with
    partial pivoting; a tiny ridge keeps degenerate systems solvable."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for i in range(n):
        m[i][i] += 1e-12
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        d = m[col][col]
        if abs(d) < 1e-300:
            continue
        for r in range(col + 1, n):
            f = m[r][col] / d
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        d = m[i][i]
        s = m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))
        x[i] = s / d if abs(d) >= 1e-300 else 0.0
    return x


def nnls(a: List[List[float]], b: List[float], max_iter: int = 100) -> List[float]:
    """Non-negative least squares (Lawson and Hanson's active-set method) in plain Python:
    minimises |a x - b| subject to x >= 0. Meant for a handful of unknowns."""
    m, n = len(a), len(a[0])
    ata = [[sum(a[r][i] * a[r][j] for r in range(m)) for j in range(n)] for i in range(n)]
    atb = [sum(a[r][i] * b[r] for r in range(m)) for i in range(n)]

    def gradient(x: List[float]) -> List[float]:
        return [atb[i] - sum(ata[i][j] * x[j] for j in range(n)) for i in range(n)]

    def solve_on(passive: List[int]) -> List[float]:
        sub = [[ata[i][j] for j in passive] for i in passive]
        z = _solve_spd(sub, [atb[i] for i in passive])
        full = [0.0] * n
        for k, i in enumerate(passive):
            full[i] = z[k]
        return full

    x = [0.0] * n
    passive: List[int] = []
    tol = 1e-12 * max(1.0, max(abs(v) for v in atb))
    for _ in range(max_iter):
        w = gradient(x)
        candidates = [j for j in range(n) if j not in passive and w[j] > tol]
        if not candidates:
            break
        passive.append(max(candidates, key=lambda j: w[j]))
        for _ in range(max_iter):
            z = solve_on(passive)
            if all(z[j] > 0 for j in passive):
                x = z
                break
            alpha = min(x[j] / (x[j] - z[j]) for j in passive if z[j] <= 0)
            x = [x[i] + alpha * (z[i] - x[i]) for i in range(n)]
            passive = [j for j in passive if x[j] > 1e-15]
            for j in range(n):
                if j not in passive:
                    x[j] = 0.0
            if not passive:
                break
    return x


@dataclass
class Fit:
    """The fitted constants and how well they reproduce the measurements."""

    cost: Dict[str, float]
    predicted: List[float]
    rel_residuals: List[float]
    rms_rel: float
    max_rel: float


def _evaluate(cost: Dict[str, float], points: Sequence[Point], ms: Sequence[float]) -> Fit:
    pred = [model_ms(cost, p) for p in points]
    rel = [(pr - y) / y for pr, y in zip(pred, ms)]
    rms = math.sqrt(sum(r * r for r in rel) / len(rel))
    return Fit(cost, pred, rel, rms, max(abs(r) for r in rel))


def _fit_partition(points: Sequence[Point], ms: Sequence[float], weight_bound: Sequence[bool]) -> Dict[str, float]:
    """NNLS of the model made linear by deciding which steps are weight-bound (the max() picks
    `weight_read_ms`) and which compute-bound; rows are weighted by 1/measured, so relative
    errors are what is minimised."""
    rows = []
    for p, wb in zip(points, weight_bound):
        rows.append(
            [
                0.0 if p.chunks else 1.0,
                1.0 if p.chunks else 0.0,
                1.0 if wb else 0.0,
                0.0 if wb else float(p.tokens),
                float(p.prefill_attention_pairs),
                float(p.context_tokens),
            ]
        )
    a = [[v / y for v in row] for row, y in zip(rows, ms)]
    b = [1.0] * len(ms)
    # Columns scaled to unit norm for conditioning (pairs run to 1e8, overheads are 1).
    norms = [math.sqrt(sum(r[j] ** 2 for r in a)) for j in range(len(COST_KEYS))]
    live = [j for j, nrm in enumerate(norms) if nrm > 0]
    scaled = [[r[j] / norms[j] for j in live] for r in a]
    x = nnls(scaled, b)
    cost = {k: 0.0 for k in COST_KEYS}
    for k, j in enumerate(live):
        cost[COST_KEYS[j]] = x[k] / norms[j]
    return cost


def fit_constants(points: Sequence[Point], ms: Sequence[float], start: Optional[Dict[str, float]] = None) -> Fit:
    """Fits the six constants to measured step times.

    The max() of the model makes it piecewise linear in the token count; every split of the
    steps into weight-bound (fewer tokens than a threshold) and compute-bound is fitted by NNLS,
    each fit is scored with the model's own max(), and the best is then re-split by its own
    crossover (weight_read_ms / per_token_ms) until that no longer improves it. With `start`
    (constants of a fit to nearly the same points) only its split is tried, then re-split."""
    if len(points) != len(ms) or not points:
        raise ValueError("one measured time a point, at least one point")
    if any(not (y > 0 and math.isfinite(y)) for y in ms):
        raise ValueError("measured times must be positive and finite")
    if start is not None:
        splits = [[start["weight_read_ms"] >= p.tokens * start["per_token_ms"] for p in points]]
    else:
        thresholds = [-1] + sorted({p.tokens for p in points})
        splits = [[p.tokens <= t for p in points] for t in thresholds]
    best: Optional[Fit] = None
    for split in splits:
        cost = _fit_partition(points, ms, split)
        f = _evaluate(cost, points, ms)
        if best is None or f.rms_rel < best.rms_rel:
            best = f
    assert best is not None
    for _ in range(10):
        c = best.cost
        split = [c["weight_read_ms"] >= p.tokens * c["per_token_ms"] for p in points]
        f = _evaluate(_fit_partition(points, ms, split), points, ms)
        if f.rms_rel >= best.rms_rel - 1e-15:
            break
        best = f
    return best


def jackknife_stderr(points: Sequence[Point], ms: Sequence[float]) -> Dict[str, float]:
    """Each constant's jackknife standard error: the spread of the fits that leave one point
    out. Large for a constant the grid pins down poorly (decode_overhead_ms, which the fit
    tells apart from weight_read_ms only through the steps either side of the crossover)."""
    n = len(points)
    if n < 8:
        return {k: float("nan") for k in COST_KEYS}
    whole = fit_constants(points, ms).cost
    fits = []
    for i in range(n):
        pts = [p for j, p in enumerate(points) if j != i]
        ys = [y for j, y in enumerate(ms) if j != i]
        if coverage_gaps(pts):
            continue
        fits.append(fit_constants(pts, ys, start=whole).cost)
    m = len(fits)
    out = {}
    for k in COST_KEYS:
        mean = sum(f[k] for f in fits) / m
        out[k] = math.sqrt((m - 1) / m * sum((f[k] - mean) ** 2 for f in fits))
    return out


def round_cost(cost: Dict[str, float], digits: int = 6) -> Dict[str, float]:
    """The constants as written to the file (6 significant digits)."""
    return {k: float(f"{v:.{digits}g}") for k, v in cost.items()}


# --------------------------------------------------------------------------------------------
# Anchors and the TOML writer
# --------------------------------------------------------------------------------------------

#: Measured points preferred as anchors, in order.
ANCHOR_PREFERENCE = (
    ((1, 1024), ()),
    ((64, 2048), ()),
    ((0, 0), ((512, 0),)),
    ((0, 0), ((512, 12288),)),
    ((0, 0), ((8192, 0),)),
    ((32, 1024), ((512, 0),)),
)


def tolerance_for(rel_residual: float) -> float:
    """An anchor's tolerance: its fit residual rounded up to the next hundredth (with a margin
    for the loader's nanosecond rounding), at least MIN_TOLERANCE, at most 1."""
    t = math.ceil((abs(rel_residual) + 1e-4) * 100.0) / 100.0
    return min(1.0, max(MIN_TOLERANCE, t))


@dataclass
class Anchor:
    point: Point
    expect_ms: float
    tolerance: float
    what: str
    source: str


def choose_anchors(points: Sequence[Point], ms: Sequence[float], cost: Dict[str, float], source: str) -> List[Anchor]:
    """4-6 measured points, with the measured time as `expect_ms` and the fit's residual there
    (rounded up) as tolerance: the profile reproduces each of them by construction. A point the
    model misses by more than 100% cannot be an anchor (tolerance is at most 1); it is left out
    with a warning, and another point takes its place."""

    def anchor(i: int) -> Optional[Anchor]:
        p = points[i]
        expect = float(f"{ms[i]:.6g}")
        rel = (model_ms(cost, p) - expect) / expect
        tol = tolerance_for(rel)
        if abs(rel) > tol:
            log(f"warning: {p.label}: the fit misses it by {rel * 100:.0f}%; not an anchor")
            return None
        return Anchor(p, expect, tol, p.describe(), source)

    index = {(p.decode_seqs, p.decode_context, p.chunks): i for i, p in enumerate(points)}
    preferred = [index[(b, ctx, chunks)] for (b, ctx), chunks in ANCHOR_PREFERENCE if (b, ctx, chunks) in index]
    # Then the other points, tier 0 first, to reach four.
    others = [i for i, _ in sorted(enumerate(points), key=lambda ip: ip[1].tier) if i not in preferred]
    anchors: List[Anchor] = []
    for i in preferred:
        a = anchor(i)
        if a is not None:
            anchors.append(a)
    for i in others:
        if len(anchors) >= 4:
            break
        a = anchor(i)
        if a is not None:
            anchors.append(a)
    return anchors[:6]


def toml_str(s: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(s, ensure_ascii=True)


def toml_float(v: float) -> str:
    if not math.isfinite(v):
        raise ValueError(f"not a finite number: {v}")
    s = repr(float(v)) if v != 0 else "0.0"
    if "." not in s and "e" not in s and "E" not in s:
        s += ".0"
    return s


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return toml_float(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def _table(lines: List[str], header: str, items: Dict[str, object]) -> None:
    lines.append("")
    lines.append(header)
    for k, v in items.items():
        lines.append(f"{k} = {toml_value(v)}")


def render_profile(
    *,
    name: str,
    model: str,
    gpu: str,
    note: str,
    cost: Dict[str, float],
    gpu_blocks: int,
    anchors: Sequence[Anchor],
    calibration: Dict[str, object],
    calibration_tables: Dict[str, Dict[str, object]],
    points: Sequence[Dict[str, object]],
) -> str:
    """The profile file: the schema of sim/profiles/*.toml; everything else under
    `[calibration]` (which the loader keeps as free-form)."""
    lines = [
        "# Written by sim/calibrate/calibrate.py; see sim/calibrate/README.md.",
        f"name = {toml_str(name)}",
        f"model = {toml_str(model)}",
        f"gpu = {toml_str(gpu)}",
        'status = "measured"',
        f"note = {toml_str(note)}",
    ]
    _table(lines, "[cost]", {k: float(cost[k]) for k in COST_KEYS})
    _table(lines, "[kv]", {"gpu_blocks": int(gpu_blocks)})
    for a in anchors:
        p = a.point
        _table(
            lines,
            "[[anchor]]",
            {
                "what": a.what,
                "source": a.source,
                "prefill_tokens": p.prefill_tokens,
                "prefill_seqs": p.prefill_seqs,
                "prefill_attention_pairs": p.prefill_attention_pairs,
                "decode_seqs": p.decode_seqs,
                "context_tokens": p.context_tokens,
                "expect_ms": a.expect_ms,
                "tolerance": a.tolerance,
            },
        )
    _table(lines, "[calibration]", calibration)
    for sub, items in calibration_tables.items():
        _table(lines, f"[calibration.{sub}]", items)
    for row in points:
        _table(lines, "[[calibration.point]]", row)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Timers
# --------------------------------------------------------------------------------------------


@dataclass
class Measurement:
    ms: float
    detail: Dict[str, float] = field(default_factory=dict)


class SyntheticRunner:
    """The dry run's timer: the model's time under DRY_RUN_TRUTH times (1 + noise), and a
    virtual clock that advances by what the real timer would have spent."""

    def __init__(self, args: argparse.Namespace, cfg: dict):
        self.rng = random.Random(args.seed)
        self.truth = dict(DRY_RUN_TRUTH)
        self.noise = args.noise
        self.reps = args.reps
        self.warmup = args.warmup
        self.clock_s = 0.0
        self.device_name = "synthetic (dry run)"
        self.model_layers = cfg.get("num_hidden_layers", 32)
        self.timed_layers = args.layers
        self.free_bytes = DRY_RUN_FREE_BYTES
        self.info = {
            "torch": "none (dry run)",
            "attention_path": "none (dry run)",
            "decode_cuda_graphs": False,
        }

    def elapsed(self) -> float:
        return self.clock_s

    def measure(self, pt: Point) -> Measurement:
        ms = model_ms(self.truth, pt) * (1.0 + self.rng.gauss(0.0, self.noise))
        self.clock_s += 0.05 + (self.warmup + self.reps) * ms / 1000.0
        return Measurement(ms)


class TorchRunner:
    """Times steps of a Llama-shaped decoder with random bf16 weights.

    Only `--layers` of the model's layers are built and timed; their time is scaled to the full
    depth, and the embedding, final norm, LM head and greedy pick (timed apart, never scaled)
    are added. Decode-only steps run as one CUDA graph replay (vLLM's full graphs for pure
    decode); steps with a prompt chunk run eagerly."""

    def __init__(self, args: argparse.Namespace, cfg: dict):
        try:
            import torch  # noqa: PLC0415 (only the real path needs torch)
            import torch.nn.functional as F  # noqa: PLC0415
        except ImportError as e:
            raise SystemExit(f"calibrate: torch is needed without --dry-run ({e}); pip install torch numpy") from e
        self.torch, self.F = torch, F
        self.t0 = time.monotonic()
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise SystemExit("calibrate: CUDA is not available; use --device cpu (slow) or --dry-run")
        if self.cuda and self.dev.index is None:
            self.dev = torch.device("cuda", torch.cuda.current_device())
        self.warmup, self.reps = args.warmup, args.reps
        self.dtype = torch.bfloat16
        self.hid = cfg["hidden_size"]
        self.inter = cfg["intermediate_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim", self.hid // self.heads)
        self.group = self.heads // self.kv_heads
        self.vocab = cfg["vocab_size"]
        self.eps = cfg.get("rms_norm_eps", 1e-5)
        self.theta = float(cfg.get("rope_theta", 10000.0))
        self.model_layers = cfg["num_hidden_layers"]
        self.timed_layers = args.layers
        if self.cuda:
            torch.cuda.set_device(self.dev)
            free, _total = torch.cuda.mem_get_info(self.dev)
            self.free_bytes = int(free)
            self.device_name = torch.cuda.get_device_name(self.dev)
        else:
            self.free_bytes = None
            self.device_name = f"CPU ({os.cpu_count()} cores)"
        torch.manual_seed(args.seed)
        self._build_weights(args.max_position)
        self.prefill_attn, path = self._pick_prefill_attention()
        self._check_decode_attention()
        self.head_cache: Dict[Tuple[int, int, bool], float] = {}
        self.info = {
            "torch": torch.__version__,
            "cuda": str(torch.version.cuda) if self.cuda else "none",
            "attention_path": path,
            "decode_cuda_graphs": self.cuda,
        }

    # -- model ---------------------------------------------------------------------------

    def _rand(self, *shape: int, scale: float = 0.02):
        t = self.torch.randn(*shape, device=self.dev, dtype=self.dtype)
        return t if scale == 1.0 else t.mul_(scale)

    def _build_weights(self, max_position: int) -> None:
        torch = self.torch
        q_out = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.layers = []
        for _ in range(self.timed_layers):
            self.layers.append(
                {
                    "ln1": torch.ones(self.hid, device=self.dev, dtype=self.dtype),
                    "qkv": self._rand(q_out, self.hid),
                    "o": self._rand(self.hid, self.heads * self.head_dim),
                    "ln2": torch.ones(self.hid, device=self.dev, dtype=self.dtype),
                    "gate_up": self._rand(2 * self.inter, self.hid),
                    "down": self._rand(self.hid, self.inter),
                }
            )
        self.embed = self._rand(self.vocab, self.hid)
        self.lm_head = self._rand(self.vocab, self.hid)
        self.final_norm = torch.ones(self.hid, device=self.dev, dtype=self.dtype)
        half = self.head_dim // 2
        inv_freq = 1.0 / (
            self.theta ** (torch.arange(0, half, device=self.dev, dtype=torch.float32) * 2.0 / self.head_dim)
        )
        pos = torch.arange(max_position, device=self.dev, dtype=torch.float32)
        ang = pos[:, None] * inv_freq[None, :]
        self.cos = ang.cos().to(self.dtype)
        self.sin = ang.sin().to(self.dtype)

    def _rms(self, x, w):
        F = self.F
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (self.hid,), w, self.eps)
        xf = x.float()
        xf = xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(self.dtype) * w

    def _rope(self, x, cos, sin):
        # x: (T, heads, D); cos/sin: (T, 1, D/2). Rotate-half form (Llama as in HF transformers).
        half = self.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self.torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    # -- attention -------------------------------------------------------------------------

    def _reference_attention(self, q, k, v):
        """float32 attention, lower-right causal, GQA by repetition: the check for the rest."""
        torch = self.torch
        n, s = q.shape[-2], k.shape[-2]
        kf = k.float().repeat_interleave(self.group, dim=1)
        vf = v.float().repeat_interleave(self.group, dim=1)
        scores = q.float() @ kf.transpose(-1, -2) / math.sqrt(self.head_dim)
        mask = torch.ones(n, s, dtype=torch.bool, device=q.device).tril(diagonal=s - n)
        scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ vf

    def _pick_prefill_attention(self):
        """The fastest correct way this torch offers for a prompt chunk attending to its
        earlier context (causal, aligned bottom-right) with grouped KV heads: each candidate is
        checked against a float32 reference on the device, and of those that match, the fastest
        on a GPU (the first on CPU) is used."""
        torch, F = self.torch, self.F
        try:
            from torch.nn.attention.bias import causal_lower_right  # noqa: PLC0415
        except ImportError:
            causal_lower_right = None
        g = self.group

        def bias_gqa(q, k, v):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=causal_lower_right(q.shape[-2], k.shape[-2]), enable_gqa=True
            )

        def flash_op(q, k, v):
            # The flash kernel's causal flag aligns bottom-right when q is shorter than k.
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)[0]

        def bias_repeat(q, k, v):
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[-2], k.shape[-2]))

        def mask_repeat(q, k, v):
            n, s = q.shape[-2], k.shape[-2]
            mask = torch.ones(n, s, dtype=torch.bool, device=q.device).tril(diagonal=s - n)
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        candidates = []
        if causal_lower_right is not None:
            candidates.append(("sdpa causal_lower_right enable_gqa", bias_gqa))
        if self.cuda:
            candidates.append(("aten flash attention, causal, grouped KV", flash_op))
        if causal_lower_right is not None:
            candidates.append(("sdpa causal_lower_right, KV heads repeated", bias_repeat))
        candidates.append(("sdpa boolean mask, KV heads repeated", mask_repeat))
        failures = []
        correct = []
        for name, fn in candidates:
            ok = True
            for n, s in ((5, 12), (7, 7), (1, 9)):
                q = torch.randn(1, self.heads, n, self.head_dim, device=self.dev, dtype=self.dtype)
                k = torch.randn(1, self.kv_heads, s, self.head_dim, device=self.dev, dtype=self.dtype)
                v = torch.randn(1, self.kv_heads, s, self.head_dim, device=self.dev, dtype=self.dtype)
                try:
                    out = fn(q, k, v)
                except Exception as e:  # noqa: BLE001 (any failure means: try the next way)
                    failures.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    ok = False
                    break
                err = (out.float() - self._reference_attention(q, k, v)).abs().max().item()
                if not err < 0.05:
                    failures.append(f"{name}: off by {err:.3g} from the reference")
                    ok = False
                    break
            if ok:
                correct.append((name, fn))
        for f in failures:
            log(f"  prefill attention: not used: {f}")
        if not correct:
            raise SystemExit("calibrate: no prefill attention path works: " + "; ".join(failures))
        if not self.cuda or len(correct) == 1:
            name, fn = correct[0]
            log(f"  prefill attention: {name}")
            return fn, name
        # Several work: keep the fastest on a realistic chunk (512 tokens after 4096), so that a
        # path the dispatcher sends to a slow kernel is not the one timed.
        n, s = 512, 4608
        q = torch.randn(1, self.heads, n, self.head_dim, device=self.dev, dtype=self.dtype)
        k = torch.randn(1, self.kv_heads, s, self.head_dim, device=self.dev, dtype=self.dtype)
        v = torch.randn(1, self.kv_heads, s, self.head_dim, device=self.dev, dtype=self.dtype)
        timed = []
        for name, fn in correct:
            ms = self._time(lambda fn=fn: fn(q, k, v), graph=False)
            log(f"  prefill attention: {name}: {ms:.3f} ms for {n} queries x {s} keys")
            timed.append((ms, name, fn))
        ms, name, fn = min(timed, key=lambda t: t[0])
        log(f"  prefill attention: {name}")
        return fn, name

    def _decode_attention(self, q, k, v):
        """Decode: each sequence's one query per head against its own KV. The `group` query
        heads that share a KV head are packed as a query length (as flash-decoding does), so the
        kernel needs neither a mask nor GQA support: q (B, kv_heads, group, D)."""
        b = q.shape[0]
        qp = q.reshape(b, self.kv_heads, self.group, self.head_dim)
        out = self.F.scaled_dot_product_attention(qp, k, v)
        return out.reshape(b, self.heads * self.head_dim)

    def _check_decode_attention(self) -> None:
        torch = self.torch
        b, s = 3, 10
        q = torch.randn(b, self.heads, self.head_dim, device=self.dev, dtype=self.dtype)
        k = torch.randn(b, self.kv_heads, s, self.head_dim, device=self.dev, dtype=self.dtype)
        v = torch.randn(b, self.kv_heads, s, self.head_dim, device=self.dev, dtype=self.dtype)
        got = self._decode_attention(q, k, v).float()
        want = self._reference_attention(q.unsqueeze(2), k, v)  # (b, heads, 1, D), n=1: no mask
        err = (got - want.reshape(b, -1)).abs().max().item()
        if not err < 0.05:
            raise SystemExit(f"calibrate: packed decode attention is off by {err:.3g}")

    # -- one step ----------------------------------------------------------------------------

    def _step_tensors(self, pt: Point):
        torch = self.torch
        b, ctx = pt.decode_seqs, pt.decode_context
        pos = [ctx - 1] * b
        for n, p in pt.chunks:
            pos.extend(range(p, p + n))
        positions = torch.tensor(pos, device=self.dev, dtype=torch.long)
        caches = []
        for _ in self.layers:
            dec = None
            if b:
                dec = (
                    self._rand(b, self.kv_heads, ctx, self.head_dim, scale=1.0),
                    self._rand(b, self.kv_heads, ctx, self.head_dim, scale=1.0),
                )
            chunk = [
                (
                    self._rand(1, self.kv_heads, p + n, self.head_dim, scale=1.0),
                    self._rand(1, self.kv_heads, p + n, self.head_dim, scale=1.0),
                )
                for n, p in pt.chunks
            ]
            caches.append((dec, chunk))
        x = self._rand(pt.tokens, self.hid, scale=1.0)
        return positions, caches, x

    def _layers_fn(self, pt: Point, positions, caches, x_in) -> Callable[[], object]:
        torch = self.torch
        b, ctx = pt.decode_seqs, pt.decode_context
        h_q, h_kv, d = self.heads, self.kv_heads, self.head_dim
        q_end, k_end = h_q * d, (h_q + h_kv) * d
        inter = self.inter

        def run():
            cos = self.cos.index_select(0, positions).unsqueeze(1)
            sin = self.sin.index_select(0, positions).unsqueeze(1)
            x = x_in
            t = x.shape[0]
            for w, (dec, chunk) in zip(self.layers, caches):
                h = self._rms(x, w["ln1"])
                qkv = h @ w["qkv"].t()
                q = self._rope(qkv[:, :q_end].view(t, h_q, d), cos, sin)
                k = self._rope(qkv[:, q_end:k_end].view(t, h_kv, d), cos, sin)
                v = qkv[:, k_end:].view(t, h_kv, d)
                outs = []
                if b:
                    kc, vc = dec
                    kc[:, :, ctx - 1] = k[:b]
                    vc[:, :, ctx - 1] = v[:b]
                    outs.append(self._decode_attention(q[:b], kc, vc))
                off = b
                for (n, p), (kc, vc) in zip(pt.chunks, chunk):
                    kc[0, :, p : p + n] = k[off : off + n].transpose(0, 1)
                    vc[0, :, p : p + n] = v[off : off + n].transpose(0, 1)
                    qc = q[off : off + n].transpose(0, 1).unsqueeze(0)
                    oc = self.prefill_attn(qc, kc, vc)
                    outs.append(oc[0].transpose(0, 1).reshape(n, h_q * d))
                    off += n
                attn = outs[0] if len(outs) == 1 else torch.cat(outs)
                x = x + attn @ w["o"].t()
                h = self._rms(x, w["ln2"])
                gu = h @ w["gate_up"].t()
                x = x + (self.F.silu(gu[:, :inter]) * gu[:, inter:]) @ w["down"].t()
            return x

        return run

    def _head_fn(self, tokens: int, rows: int) -> Callable[[], object]:
        """Embedding of the step's tokens, then final norm, LM head and a greedy pick for the
        last token of each sequence (vLLM computes logits only there)."""
        torch = self.torch
        ids = torch.randint(0, self.vocab, (tokens,), device=self.dev)
        x = self._rand(rows, self.hid, scale=1.0)

        def run():
            e = self.embed.index_select(0, ids)
            logits = self._rms(x, self.final_norm) @ self.lm_head.t()
            return e, logits.argmax(-1)

        return run

    def _time(self, fn: Callable[[], object], graph: bool) -> float:
        """Median milliseconds of `reps` runs after `warmup`; with `graph`, of CUDA graph
        replays of one captured run."""
        torch = self.torch
        run = fn
        g = None
        if graph and self.cuda:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        for _ in range(self.warmup):
            run()
        times = []
        if self.cuda:
            torch.cuda.synchronize()
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(self.reps)
            ]
            for start, end in events:
                start.record()
                run()
                end.record()
            torch.cuda.synchronize()
            times = [start.elapsed_time(end) for start, end in events]
        else:
            for _ in range(self.reps):
                t0 = time.perf_counter()
                run()
                times.append((time.perf_counter() - t0) * 1000.0)
        del g
        return statistics.median(times)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def measure(self, pt: Point) -> Measurement:
        graph = pt.kind == "decode"
        positions, caches, x = self._step_tensors(pt)
        layers_ms = self._time(self._layers_fn(pt, positions, caches, x), graph)
        del positions, caches, x
        key = (pt.tokens, pt.decode_seqs + pt.prefill_seqs, graph)
        if key not in self.head_cache:
            self.head_cache[key] = self._time(self._head_fn(key[0], key[1]), graph)
        head_ms = self.head_cache[key]
        scale = self.model_layers / self.timed_layers
        return Measurement(head_ms + layers_ms * scale, {"layers_ms": layers_ms, "head_ms": head_ms})


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, flush=True)


def weight_bytes(cfg: dict) -> int:
    """bf16 bytes of the full model's weights."""
    hid, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim", hid // heads)
    layer = hid * (heads + 2 * kv) * d + heads * d * hid + 3 * hid * inter + 2 * hid
    embeds = cfg["vocab_size"] * hid * (1 if cfg.get("tie_word_embeddings") else 2)
    return 2 * (cfg["num_hidden_layers"] * layer + embeds + hid)


def kv_block_bytes(cfg: dict) -> int:
    """Bytes of one KV block: K and V, every layer, bf16, BLOCK_TOKENS tokens."""
    d = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * d * 2 * BLOCK_TOKENS


def gpu_blocks_from_free(cfg: dict, free_bytes: int) -> int:
    """KV blocks as vLLM would size them (free memory x 0.9, less the weights); activations and
    CUDA graphs are not subtracted, so this runs a few percent high."""
    blocks = int((free_bytes * GPU_MEMORY_UTILIZATION - weight_bytes(cfg)) // kv_block_bytes(cfg))
    if blocks <= 0:
        raise SystemExit(f"calibrate: {free_bytes / 2**30:.1f} GiB free does not hold the weights and any KV cache")
    return blocks


def gpu_slug(device_name: str) -> str:
    up = device_name.upper()
    for known in ("H200", "H100", "H20", "B200", "GB200", "A100", "L40S", "L4", "A10G", "MI300X"):
        if known in up:
            return known.lower()
    slug = "".join(c if c.isalnum() else "-" for c in device_name.lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return slug or "gpu"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        description="Time engine steps on a GPU and fit a vllm-sim step-cost profile (sim/calibrate/README.md).",
    )
    ap.add_argument("--config", default=os.path.join(here, "llama-3.1-8b.json"), help="model shapes (JSON)")
    ap.add_argument("--out", required=True, help="profile TOML to write")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda)")
    ap.add_argument(
        "--layers",
        type=int,
        default=8,
        help="decoder layers to build and time; the time is scaled to the model's depth (default 8)",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="stop adding grid points after this many seconds (tier-0 points are always timed; default 300)",
    )
    ap.add_argument("--gpu-blocks", type=int, default=None, help="KV blocks for [kv] (default: from free GPU memory)")
    ap.add_argument(
        "--grid", default="full", choices=("full", "small"), help="full (default) or small (a CPU smoke test)"
    )
    ap.add_argument("--reps", type=int, default=10, help="timed runs a point; the median is kept (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs before them (default 3)")
    ap.add_argument("--name", default=None, help="profile name (default <short_name>-<gpu>, e.g. llama-3.1-8b-h100)")
    ap.add_argument("--seed", type=int, default=1, help="seed for weights and the dry run's noise (default 1)")
    ap.add_argument(
        "--dry-run", action="store_true", help="no torch: a synthetic timer from known constants plus noise"
    )
    ap.add_argument(
        "--noise",
        type=float,
        default=DRY_RUN_NOISE,
        help="dry run: relative noise of the synthetic timer (default 0.01)",
    )
    args = ap.parse_args(argv)
    if args.layers < 1:
        ap.error("--layers must be at least 1")
    if args.reps < 1 or args.warmup < 0:
        ap.error("--reps must be at least 1 and --warmup at least 0")
    if args.gpu_blocks is not None and args.gpu_blocks < 1:
        ap.error("--gpu-blocks must be at least 1")
    if args.budget_s < 0 or args.noise < 0:
        ap.error("--budget-s and --noise must not be negative")
    return args


def measure_grid(runner, grid: Grid, budget_s: float) -> Tuple[List[Point], List[Measurement]]:
    """Times tier-0 points always and the rest while `budget_s` lasts (counted from start)."""
    points: List[Point] = []
    results: List[Measurement] = []
    total = len(grid.points)
    for i, pt in enumerate(grid.points):
        if pt.tier > 0 and runner.elapsed() >= budget_s:
            log(f"[{runner.elapsed():7.1f} s] budget of {budget_s:.0f} s spent: {total - i} of {total} points left out")
            break
        m = runner.measure(pt)
        points.append(pt)
        results.append(m)
        extra = ""
        if m.detail:
            scale = f"x{runner.model_layers}/{runner.timed_layers}"
            extra = f"  (layers {m.detail['layers_ms']:.3f} ms {scale} + head {m.detail['head_ms']:.3f} ms)"
        log(f"[{runner.elapsed():7.1f} s] {i + 1:3d}/{total} {pt.kind:7s} {pt.label:40s} {m.ms:9.3f} ms{extra}")
    return points, results


def run(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    wall0 = time.monotonic()
    with open(args.config, encoding="utf-8") as f:
        cfg = json.load(f)
    if args.layers > cfg["num_hidden_layers"]:
        raise SystemExit(f"calibrate: --layers {args.layers} is more than the model's {cfg['num_hidden_layers']}")
    grid = build_grid(args.grid)
    args.max_position = max(p + n for pt in grid.points for n, p in pt.chunks) + 1
    args.max_position = max(args.max_position, max(pt.decode_context for pt in grid.points))
    log(f"calibrate: {'dry run, ' if args.dry_run else ''}{len(grid.points)} points, budget {args.budget_s:.0f} s")
    runner = SyntheticRunner(args, cfg) if args.dry_run else TorchRunner(args, cfg)
    if not args.dry_run:
        layers = f"{runner.timed_layers} of {runner.model_layers} layers timed"
        log(f"  device {runner.device_name}, torch {runner.info['torch']}, {layers}")

    points, results = measure_grid(runner, grid, args.budget_s)
    gaps = coverage_gaps(points)
    if gaps:
        raise SystemExit("calibrate: the measured points cannot identify every constant; missing: " + "; ".join(gaps))
    ms = [m.ms for m in results]
    fit = fit_constants(points, ms)
    cost = round_cost(fit.cost)
    fit = _evaluate(cost, points, ms)
    stderr = jackknife_stderr(points, ms)

    if args.gpu_blocks is not None:
        gpu_blocks, blocks_from = args.gpu_blocks, "--gpu-blocks"
    else:
        gpu_blocks = gpu_blocks_from_free(cfg, runner.free_bytes) if runner.free_bytes else 25_000
        blocks_from = (
            f"free memory {runner.free_bytes / 2**30:.2f} GiB x {GPU_MEMORY_UTILIZATION} - weights "
            f"{weight_bytes(cfg) / 2**30:.2f} GiB, / {kv_block_bytes(cfg) // 1024} KiB a block"
            if runner.free_bytes
            else "default 25000 (no GPU memory to measure)"
        )

    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    date = now.isoformat().replace("+00:00", "Z")
    gpu = runner.device_name
    if args.dry_run:
        source = "sim/calibrate/calibrate.py --dry-run (synthetic timer, not a GPU)"
    else:
        how = "CUDA events" if runner.cuda else "wall clock"
        source = f"sim/calibrate/calibrate.py on {gpu}, {date[:10]}: median of {args.reps} runs ({how})"
    anchors = choose_anchors(points, ms, cost, source)
    short = cfg.get("short_name", "model")
    name = args.name or (f"{short}-dry-run" if args.dry_run else f"{short}-{gpu_slug(gpu)}")
    model = f"{cfg.get('model', short)}, {cfg.get('dtype', 'bfloat16').replace('bfloat16', 'bf16')}"
    if args.dry_run:
        note = "Dry run of sim/calibrate/calibrate.py: constants fitted to a synthetic timer, not measured on a GPU."
    else:
        note = (
            f"Measured by sim/calibrate/calibrate.py on {gpu}: random bf16 weights with the model's shapes, "
            f"{args.layers} of {cfg['num_hidden_layers']} layers timed and scaled, PyTorch SDPA attention on "
            "contiguous KV (no paged attention, no sampling beyond a greedy pick, no torch.compile fusion); "
            "see sim/calibrate/README.md."
        )
    elapsed = time.monotonic() - wall0
    calibration: Dict[str, object] = {
        "tool": "sim/calibrate/calibrate.py",
        "date": date,
        "dry_run": bool(args.dry_run),
        "device": gpu,
        "torch": runner.info["torch"],
        "attention_path": runner.info["attention_path"],
        "decode_cuda_graphs": bool(runner.info["decode_cuda_graphs"]),
        "model_layers": cfg["num_hidden_layers"],
        "timed_layers": args.layers,
        "warmup": args.warmup,
        "reps": args.reps,
        "budget_s": float(args.budget_s),
        "elapsed_s": round(runner.elapsed() if args.dry_run else elapsed, 1),
        "gpu_blocks_from": blocks_from,
    }
    if "cuda" in runner.info:
        calibration["cuda"] = runner.info["cuda"]
    tables: Dict[str, Dict[str, object]] = {
        "fit": {
            "method": "non-negative least squares of relative error; every weight-/compute-bound split by tokens tried",
            "points": len(points),
            "rms_rel_residual": round(fit.rms_rel, 5),
            "max_rel_residual": round(fit.max_rel, 5),
            "crossover_tokens": round(cost["weight_read_ms"] / cost["per_token_ms"], 1)
            if cost["per_token_ms"] > 0
            else -1.0,
        },
        "stderr": {k: float(f"{v:.3g}") for k, v in stderr.items() if math.isfinite(v)},
        "grid": {
            "name": grid.name,
            "decode_batches": list(grid.decode_batches),
            "decode_contexts": list(grid.decode_contexts),
            "chunk_sizes": list(grid.chunk_sizes),
            "chunk_positions": list(grid.chunk_positions),
            "max_decode_tokens": MAX_DECODE_TOKENS,
            "points_planned": len(grid.points),
            "points_measured": len(points),
        },
    }
    if args.dry_run:
        tables["dry_run_truth"] = {
            **{k: float(v) for k, v in DRY_RUN_TRUTH.items()},
            "noise": float(args.noise),
            "seed": args.seed,
        }
    rows = []
    for pt, m, pred, rel in zip(points, results, fit.predicted, fit.rel_residuals):
        row: Dict[str, object] = {
            "kind": pt.kind,
            "decode_seqs": pt.decode_seqs,
            "decode_context": pt.decode_context,
            "chunks": [list(c) for c in pt.chunks],
            "prefill_tokens": pt.prefill_tokens,
            "prefill_attention_pairs": pt.prefill_attention_pairs,
            "context_tokens": pt.context_tokens,
            "measured_ms": round(m.ms, 4),
            "fit_ms": round(pred, 4),
            "rel_residual": round(rel, 4),
        }
        row.update({k: round(v, 4) for k, v in m.detail.items()})
        rows.append(row)
    text = render_profile(
        name=name,
        model=model,
        gpu=gpu,
        note=note,
        cost=cost,
        gpu_blocks=gpu_blocks,
        anchors=anchors,
        calibration=calibration,
        calibration_tables=tables,
        points=rows,
    )
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.out)

    log("fit:")
    for k in COST_KEYS:
        rel = f" ({100 * stderr[k] / cost[k]:.1f}%)" if cost[k] > 0 and math.isfinite(stderr[k]) else ""
        log(f"  {k:24s} = {cost[k]:<12.6g} jackknife standard error {stderr[k]:.3g}{rel}")
    log(f"  residuals: rms {fit.rms_rel * 100:.2f}%, max {fit.max_rel * 100:.2f}% over {len(points)} points")
    log(f"  gpu_blocks = {gpu_blocks} ({blocks_from})")
    log(f"wrote {args.out} ({len(anchors)} anchors) in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run())
