"""Detection delays of the reward-hacking monitors, as docs/diagnostics.md states them.

Scripted policies (tests/diagnostics/diag_synthetic.py) behave for ONSET steps, then game a lenient
reward function; runs are fed through ``Diagnostics`` as a user's run would be (plain functions, no
roles declared, rlvr's math checker shadow-grading), over seeds 0..N-1 at 8 prompts x 8 completions.
Prints JSON: per hack, the steps from onset to the first warning for each seed (null = never), and
how many healthy runs raised anything.

    python benchmarks/monitor_delays.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "diagnostics"))

from diag_synthetic import (  # noqa: E402
    HACKING_POLICIES,
    ONSET,
    Policy,
    all_warnings,
    answer_in_tail,
    const,
    first_warning,
    lenient_numbers_checker,
    run_policy,
    strict_checker,
    switch,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    cases = {name: (make, name, name != "test_tampering") for name, make in HACKING_POLICIES.items()}
    for style, checker in (
        ("two", lenient_numbers_checker),
        ("concat", answer_in_tail),
        ("three", lenient_numbers_checker),
    ):
        cases[f"answer_spraying/{style}"] = (
            lambda style=style, checker=checker: Policy(
                p_correct=const(0.3), p_spray=switch(0.0, 0.5, ONSET), spray_style=style, checker=checker
            ),
            "answer_spraying",
            True,
        )
    cases["answer_spraying/20%"] = (
        lambda: Policy(lenient_checker=True, p_correct=const(0.3), p_spray=switch(0.0, 0.2, ONSET)),
        "answer_spraying",
        True,
    )
    out: dict = {"onset": ONSET, "delays": {}}
    for label, (make, monitor, plain) in cases.items():
        delays = []
        for seed in range(args.seeds):
            kwargs = {"plain": True} if plain else {"reward_funcs": {"correct": strict_checker}}
            _, trace = run_policy(make(), ONSET + 25, seed=seed, **kwargs)
            first = first_warning(trace, monitor)
            delays.append(None if first is None else first - ONSET)
        out["delays"][label] = delays
    noisy = sum(bool(all_warnings(run_policy(Policy(), 80, seed=s, plain=True)[1])) for s in range(args.seeds))
    out["healthy_runs_with_a_warning"] = f"{noisy} of {args.seeds}"
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
