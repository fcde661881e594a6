#!/usr/bin/env python3
"""bench/eval_loops.py: what an eval_spec run's tau owes to loops, and where a pass's time goes.

    bench/eval_spec.sh --json-out RUNS.json ...   then   python3 bench/eval_loops.py RUNS.json

Reads the per-prompt records that eval_spec.py writes with --json-out (standard library only)
and prints, for each greedy set:
  - loops: how many plain greedy outputs end in a repeat, i.e. their last TAIL tokens are
    periodic with a period of at most MAX_PERIOD tokens, and the mean share of repeated
    4-grams in the outputs (small models decoded greedily fall into such loops; loops are easy
    to draft, so they raise tau);
  - tau without loops: tokens committed per target pass over the prompts whose plain output
    does not end in a repeat, for each speculative mode;
and, for every set and temperature, the time per speculative pass (generated tokens / tok/s,
summed over prompts, divided by passes), the drafter's part of it (draft_seconds), the mean
verify width, and the time per plain token.
"""

import json
import sys

TAIL = 48
MAX_PERIOD = 16


def ends_in_loop(tokens):
    tail = tokens[-TAIL:]
    if len(tail) < TAIL:
        return False
    return any(all(tail[i] == tail[i - p] for i in range(p, TAIL)) for p in range(1, MAX_PERIOD + 1))


def repeated_4grams(tokens):
    grams = [tuple(tokens[i:i + 4]) for i in range(len(tokens) - 3)]
    return 1 - len(set(grams)) / max(1, len(grams))


def seconds(runs):
    return sum(r["n_gen"] / r["tok_per_s"] for r in runs if r["tok_per_s"] > 0)


def main(path):
    for entry in json.load(open(path)):
        name, temp, runs = entry["set"], entry["temp"], entry["runs"]
        plain = runs["plain"]
        modes = [m for m in runs if m != "plain"]
        if temp == 0:
            loops = [ends_in_loop(r["tokens"]) for r in plain]
            rep = sum(repeated_4grams(r["tokens"]) for r in plain) / len(plain)
            print(f"{name} T=0: {sum(loops)}/{len(plain)} plain outputs end in a loop "
                  f"(last {TAIL} tokens periodic, period <= {MAX_PERIOD}); repeated 4-grams {rep:.1%}")
            keep = [i for i, looped in enumerate(loops) if not looped]
            for m in modes:
                sel = [runs[m][i] for i in keep]
                passes = sum(r["spec"]["passes"] for r in sel)
                tau = sum(r["n_gen"] for r in sel) / passes if passes else float("nan")
                print(f"  tau without loops, {m}: {tau:.2f} over {len(sel)} prompts")
        ms_plain = 1e3 * seconds(plain) / sum(r["n_gen"] for r in plain)
        print(f"{name} T={temp:g}: plain {ms_plain:.3f} ms per token")
        for m in modes:
            rs = runs[m]
            passes = sum(r["spec"]["passes"] for r in rs)
            width = sum(r["spec"]["mean_verify_width"] * r["spec"]["passes"] for r in rs) / passes
            draft = sum(r["spec"]["draft_seconds"] for r in rs)
            print(f"  {m}: {1e3 * seconds(rs) / passes:.2f} ms per pass, drafter {1e3 * draft / passes:.2f} ms, "
                  f"mean verify width {width:.2f}, {passes} passes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
