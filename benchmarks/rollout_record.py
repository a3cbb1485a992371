"""What the rollout record (``rollouts.jsonl.gz``, rlvr/diagnostics/record.py) costs per 1,000 completions.

    python benchmarks/rollout_record.py                 # both kinds of text, the record's level and level 6
    python benchmarks/rollout_record.py --steps 50 --per-step 256

Writes ``--steps`` steps of ``--per-step`` completions with ``append_lines`` (one gzip member a step, as the
trainer does) into a temporary file, then reads it back with ``read_record``. Records are shaped like the
trainer's (rlvr.batch.completion_records: GSM8K-style prompt, a checker's full verdict, a gold column); the
completion text is either arithmetic chain-of-thought with random numbers (~440 characters, compresses least) or
English prose (~710 characters). Prints size, raw JSON size, write and read seconds per 1,000 completions, per
deflate level (the record's own, ``COMPRESS_LEVEL``, and 6, zlib's default, for comparison).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlvr.diagnostics import record  # noqa: E402

PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
          "clips did Natalia sell altogether in April and May?")
WORDS = ("the a model learns from rewards that a program computes and each group of completions shares one prompt "
         "so the baseline is their mean while the policy moves toward answers that pass the checker").split()


def arithmetic(rng: random.Random) -> str:
    parts: list[str] = []
    while sum(map(len, parts)) < 440:
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        parts.append(f"First, {a} + {b} = {a + b}. Then multiply by {rng.randint(2, 9)}. ")
    return "".join(parts) + f"\\boxed{{{rng.randint(1, 9999)}}}"


def prose(rng: random.Random) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < 710:
        words.append(rng.choice(WORDS))
    return " ".join(words).capitalize() + "."


def records(step: int, n: int, text, rng: random.Random) -> list[dict]:
    out = []
    for i in range(n):
        correct = rng.random() < 0.5
        out.append({
            "step": step, "prompt_id": f"{i // 8:016x}", "group": i // 8, "index": i % 8, "prompt": PROMPT,
            "completion": text(rng), "n_tokens": rng.randint(90, 130), "finish_reason": "stop", "truncated": False,
            "rewards": {"math": float(correct)}, "reward": float(correct), "advantage": rng.uniform(-1, 1),
            "correct": correct,
            "verdict": {"correct": correct, "reward": float(correct), "extracted": "72", "path": "boxed",
                        "n_candidates": 1, "reason": "ok" if correct else "wrong", "seconds": rng.uniform(0, 1e-4),
                        "extra": {}},
            "data_source": None, "columns": {"answer": "72"},
        })
    return out


def measure(kind: str, text, level: int, steps: int, per_step: int) -> dict:
    rng = random.Random(0)
    batches = [records(s, per_step, text, rng) for s in range(steps)]
    raw = sum(len(record.to_json_line(r).encode()) for b in batches for r in b)
    plain_level, record.COMPRESS_LEVEL = record.COMPRESS_LEVEL, level
    try:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / record.RECORD_NAME
            t0 = time.perf_counter()
            for b in batches:
                record.append_lines(path, b)
            write_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            _, read = record.read_record(path)
            read_s = time.perf_counter() - t0
            assert sum(len(v) for v in read.values()) == steps * per_step
            size = path.stat().st_size
    finally:
        record.COMPRESS_LEVEL = plain_level
    per = 1000 / (steps * per_step)
    return {"kind": kind, "level": level, "kib": size * per / 1024, "raw_kib": raw * per / 1024,
            "write_s": write_s * per, "read_s": read_s * per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--per-step", type=int, default=64)
    args = ap.parse_args()
    print("| completions | deflate level | record per 1,000 | raw JSON per 1,000 | write per 1,000 | read per 1,000 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, text in (("arithmetic chain-of-thought, random numbers", arithmetic), ("English prose", prose)):
        for level in sorted({record.COMPRESS_LEVEL, 6}):
            m = measure(kind, text, level, args.steps, args.per_step)
            mark = " (the record's)" if level == record.COMPRESS_LEVEL else ""
            print(f"| {kind} | {level}{mark} | {m['kib']:.0f} KiB | {m['raw_kib']:.0f} KiB | "
                  f"{m['write_s'] * 1000:.1f} ms | {m['read_s'] * 1000:.1f} ms |")


if __name__ == "__main__":
    main()
