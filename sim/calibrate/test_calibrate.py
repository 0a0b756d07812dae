"""CPU tests of sim/calibrate/calibrate.py: the grid, the fit and the file it writes, through the
dry run (no torch). Run: python3 sim/calibrate/test_calibrate.py (from anywhere)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ left in the source tree

import calibrate as cal  # noqa: E402

try:
    import tomllib  # Python 3.11+
except ImportError:  # pragma: no cover
    tomllib = None

SCRIPT = os.path.join(HERE, "calibrate.py")

TOP_KEYS = {"name", "model", "gpu", "status", "note", "cost", "kv", "anchor", "calibration"}
ANCHOR_KEYS = {
    "what",
    "source",
    "prefill_tokens",
    "prefill_seqs",
    "prefill_attention_pairs",
    "decode_seqs",
    "context_tokens",
    "expect_ms",
    "tolerance",
}


def dry_run(*extra: str) -> tuple[subprocess.CompletedProcess, str]:
    """Runs the script's dry run into a temporary file; returns the process and the file's text."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "profile.toml")
        proc = subprocess.run(
            [sys.executable, SCRIPT, "--dry-run", "--out", out, *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        text = ""
        if os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                text = f.read()
        return proc, text


class GridTest(unittest.TestCase):
    def test_full_grid_covers_every_term(self):
        grid = cal.build_grid("full")
        pts = grid.points
        self.assertEqual(cal.coverage_gaps(pts), [])
        kinds = {p.kind for p in pts}
        self.assertEqual(kinds, {"decode", "prefill", "mixed"})
        positions = {pos for p in pts for _, pos in p.chunks}
        self.assertIn(0, positions, "an early chunk")
        self.assertTrue(max(positions) >= 8192, f"a late chunk of a long prompt: {sorted(positions)}")
        # Under H100-like constants the grid has steps on both sides of the weight/compute
        # crossover, with and without a prompt chunk (else the overheads and weight_read_ms
        # are confounded).
        t = cal.DRY_RUN_TRUTH
        crossover = t["weight_read_ms"] / t["per_token_ms"]
        for chunked in (False, True):
            sub = [p for p in pts if bool(p.chunks) == chunked]
            self.assertTrue(any(p.tokens < crossover for p in sub), f"weight-bound, chunked={chunked}")
            self.assertTrue(any(p.tokens > crossover for p in sub), f"compute-bound, chunked={chunked}")
        self.assertTrue(any(p.prefill_seqs > 1 for p in pts), "a step with several prompt chunks")
        for p in pts:
            self.assertLessEqual(p.context_tokens, cal.MAX_DECODE_TOKENS)

    def test_tier_zero_alone_identifies_every_constant(self):
        for name in ("full", "small"):
            core = [p for p in cal.build_grid(name).points if p.tier == 0]
            self.assertEqual(cal.coverage_gaps(core), [], name)
            pts = cal.build_grid(name).points
            tiers = [p.tier for p in pts]
            self.assertEqual(tiers, sorted(tiers), "tier 0 is timed first")

    def test_coverage_gaps_names_what_is_missing(self):
        only_decode = [p for p in cal.build_grid("full").points if p.kind == "decode"]
        gaps = cal.coverage_gaps(only_decode)
        self.assertTrue(any("mixed" in g for g in gaps), gaps)
        self.assertTrue(any("late" in g for g in gaps), gaps)
        early_only = [p for p in cal.build_grid("full").points if all(pos == 0 for _, pos in p.chunks)]
        self.assertTrue(any("late" in g for g in cal.coverage_gaps(early_only)))

    def test_step_shape_matches_the_simulator(self):
        p = cal.Point(decode_seqs=3, decode_context=100, chunks=((512, 11776), (16, 0)))
        self.assertEqual(p.prefill_tokens, 528)
        self.assertEqual(p.prefill_seqs, 2)
        self.assertEqual(p.prefill_attention_pairs, 512 * 11776 + 512 * 513 // 2 + 16 * 17 // 2)
        self.assertEqual(p.context_tokens, 300)
        self.assertEqual(p.kind, "mixed")


class FitTest(unittest.TestCase):
    def test_nnls_clamps_a_negative_coefficient(self):
        # y = 2*x0 - 1*x1 unconstrained; with x >= 0 the best is x1 = 0.
        a = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
        b = [2.0, -1.0, 1.0]
        x = cal.nnls(a, b)
        self.assertEqual(x[1], 0.0)
        self.assertAlmostEqual(x[0], 1.5, places=9)
        # And an exactly solvable positive system is solved exactly.
        x = cal.nnls([[1.0, 2.0], [3.0, 1.0], [1.0, 1.0]], [5.0, 5.0, 3.0])
        self.assertAlmostEqual(x[0], 1.0, places=9)
        self.assertAlmostEqual(x[1], 2.0, places=9)

    def test_fit_recovers_exact_constants(self):
        pts = list(cal.build_grid("full").points)
        ms = [cal.model_ms(cal.DRY_RUN_TRUTH, p) for p in pts]
        fit = cal.fit_constants(pts, ms)
        for k, v in cal.DRY_RUN_TRUTH.items():
            self.assertAlmostEqual(fit.cost[k] / v, 1.0, places=4, msg=k)
        self.assertLess(fit.max_rel, 1e-6)

    def test_fit_recovers_noisy_constants_within_a_few_percent(self):
        for seed in (1, 2, 3):
            args = cal.parse_args(["--dry-run", "--out", "unused", "--seed", str(seed)])
            runner = cal.SyntheticRunner(args, {})
            pts = list(cal.build_grid("full").points)
            ms = [runner.measure(p).ms for p in pts]
            fit = cal.fit_constants(pts, ms)
            se = cal.jackknife_stderr(pts, ms)
            t = cal.DRY_RUN_TRUTH
            for k, v in t.items():
                # Within 5%, or within three of the fit's own standard errors where the grid
                # pins a constant down less well (decode_overhead_ms, a small part of a step).
                err = abs(fit.cost[k] - v)
                self.assertLess(err, max(0.05 * v, 3 * se[k]), f"seed {seed}: {k} = {fit.cost[k]} vs {v} (se {se[k]})")
                self.assertLess(se[k], 0.1 * v, f"seed {seed}: {k}: standard error {se[k]}")
            # What a decode step costs at small batch (overhead + weight read) within 2%.
            self.assertLess(
                abs(
                    fit.cost["decode_overhead_ms"]
                    + fit.cost["weight_read_ms"]
                    - t["decode_overhead_ms"]
                    - t["weight_read_ms"]
                ),
                0.02 * (t["decode_overhead_ms"] + t["weight_read_ms"]),
            )
            self.assertLess(fit.rms_rel, 0.02)

    def test_a_point_the_model_cannot_reach_is_not_an_anchor(self):
        pts = list(cal.build_grid("full").points)
        ms = [cal.model_ms(cal.DRY_RUN_TRUTH, p) for p in pts]
        bad = next(i for i, p in enumerate(pts) if (p.decode_seqs, p.decode_context, p.chunks) == (1, 1024, ()))
        ms[bad] /= 3.0  # the model then overshoots it by 200%
        anchors = cal.choose_anchors(pts, ms, cal.DRY_RUN_TRUTH, "test")
        self.assertTrue(4 <= len(anchors) <= 6, len(anchors))
        self.assertNotIn(pts[bad], [a.point for a in anchors])
        for a in anchors:
            rel = abs(cal.model_ms(cal.DRY_RUN_TRUTH, a.point) - a.expect_ms) / a.expect_ms
            self.assertLessEqual(rel, a.tolerance)
            self.assertLessEqual(a.tolerance, 1.0)

    def test_tolerance_is_rounded_up_and_bounded(self):
        self.assertEqual(cal.tolerance_for(0.0), 0.05)
        self.assertEqual(cal.tolerance_for(-0.031), 0.05)
        self.assertEqual(cal.tolerance_for(0.061), 0.07)
        self.assertEqual(cal.tolerance_for(-0.069), 0.07)
        self.assertGreaterEqual(cal.tolerance_for(0.07), 0.07)
        self.assertEqual(cal.tolerance_for(3.0), 1.0)


@unittest.skipIf(tomllib is None, "tomllib needs Python 3.11")
class OutputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc, text = dry_run()
        cls.doc = tomllib.loads(text) if cls.proc.returncode == 0 else None

    def setUp(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)

    def test_every_required_key_and_nothing_unknown(self):
        d = self.doc
        self.assertEqual(set(d), TOP_KEYS)
        self.assertEqual(d["status"], "measured")
        for k in ("name", "model", "gpu", "note"):
            self.assertIsInstance(d[k], str)
            self.assertTrue(d[k])
        self.assertEqual(set(d["cost"]), set(cal.COST_KEYS))
        for k, v in d["cost"].items():
            self.assertIsInstance(v, float, k)
            self.assertGreaterEqual(v, 0.0, k)
        self.assertEqual(set(d["kv"]), {"gpu_blocks"})
        self.assertIsInstance(d["kv"]["gpu_blocks"], int)
        self.assertGreater(d["kv"]["gpu_blocks"], 0)
        self.assertTrue(4 <= len(d["anchor"]) <= 6, len(d["anchor"]))
        for a in d["anchor"]:
            self.assertEqual(set(a), ANCHOR_KEYS)
            self.assertTrue(cal.MIN_TOLERANCE <= a["tolerance"] <= 1.0)
            self.assertGreater(a["expect_ms"], 0.0)

    def test_anchors_cover_decode_prefill_and_late_chunks_and_are_reproduced(self):
        d = self.doc
        kinds = set()
        for a in d["anchor"]:
            decode = a["decode_seqs"] > 0
            prefill = a["prefill_tokens"] > 0
            kinds.add("mixed" if decode and prefill else "decode" if decode else "prefill")
            overhead = d["cost"]["mixed_overhead_ms"] if prefill else d["cost"]["decode_overhead_ms"]
            c = d["cost"]
            got = (
                overhead
                + max(c["weight_read_ms"], (a["prefill_tokens"] + a["decode_seqs"]) * c["per_token_ms"])
                + a["prefill_attention_pairs"] * c["per_attention_pair_ms"]
                + a["context_tokens"] * c["per_context_token_ms"]
            )
            self.assertLessEqual(abs(got - a["expect_ms"]) / a["expect_ms"], a["tolerance"], a["what"])
        self.assertEqual(kinds, {"decode", "prefill", "mixed"})
        late = [
            a for a in d["anchor"] if a["prefill_tokens"] and a["prefill_attention_pairs"] > a["prefill_tokens"] ** 2
        ]
        self.assertTrue(late, "an anchor with a chunk late in its prompt")

    def test_calibration_records_the_grid_and_residuals(self):
        cb = self.doc["calibration"]
        self.assertTrue(cb["dry_run"])
        self.assertEqual(cb["grid"]["points_measured"], len(cb["point"]))
        self.assertEqual(cb["grid"]["points_planned"], len(cal.build_grid("full").points))
        self.assertLess(cb["fit"]["rms_rel_residual"], 0.02)
        for row in cb["point"]:
            self.assertAlmostEqual(
                row["rel_residual"], (row["fit_ms"] - row["measured_ms"]) / row["measured_ms"], places=3
            )
        truth = cb["dry_run_truth"]
        for k in cal.COST_KEYS:
            err = abs(self.doc["cost"][k] - truth[k])
            self.assertLess(err, max(0.05 * truth[k], 3 * cb["stderr"][k]), k)

    def test_gpu_blocks_from_memory_or_flag(self):
        # 79.1 GiB x 0.9 - 14.96 GiB of weights, 2 MiB a block (128 KiB a token x 16).
        self.assertEqual(cal.kv_block_bytes(_llama()), 2 * 1024 * 1024)
        self.assertAlmostEqual(cal.weight_bytes(_llama()) / 1e9, 16.06, places=1)
        self.assertEqual(self.doc["kv"]["gpu_blocks"], cal.gpu_blocks_from_free(_llama(), cal.DRY_RUN_FREE_BYTES))
        proc, text = dry_run("--gpu-blocks", "1234")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(tomllib.loads(text)["kv"]["gpu_blocks"], 1234)


class CliTest(unittest.TestCase):
    def test_a_small_budget_keeps_tier_zero_only(self):
        proc, text = dry_run("--budget-s", "0")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("budget", proc.stdout)
        core = sum(1 for p in cal.build_grid("full").points if p.tier == 0)
        self.assertEqual(text.count("[[calibration.point]]"), core)

    def test_bad_flags_fail(self):
        for flags in (["--layers", "0"], ["--layers", "33"], ["--gpu-blocks", "0"], ["--grid", "huge"]):
            proc, text = dry_run(*flags)
            self.assertNotEqual(proc.returncode, 0, flags)
            self.assertEqual(text, "", flags)


def _llama() -> dict:
    import json

    with open(os.path.join(HERE, "llama-3.1-8b.json"), encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    unittest.main()
